"""Chunking helpers shared by the chunked (xla) paths.

Shape legend: B batch, T time, H heads, K key dim, V value dim, N chunks, C chunk size.
Chunked arrays are head-major, [B, H, N, C, ...], so intra-chunk products are batched matmuls.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


def precision_for(dtype):
  """float32 inputs get true float32 matmuls (GPU would otherwise use tf32); others run natively."""
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def mm(spec: str, a, b, dtype):
  """einsum with both operands in `dtype` (the input dtype) and a float32 accumulator."""
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=F32,
                    precision=precision_for(dtype))


def to_chunks(x, C: int):
  """[B, T, H, ...] with T % C == 0 -> [B, H, N, C, ...]."""
  B, T, H = x.shape[:3]
  x = x.reshape(B, T // C, C, H, *x.shape[3:])
  return jnp.moveaxis(x, 3, 1)


def from_chunks(x):
  """[B, H, N, C, ...] -> [B, N*C, H, ...]."""
  B, H, N, C = x.shape[:4]
  x = jnp.moveaxis(x, 1, 3)
  return x.reshape(B, N * C, H, *x.shape[4:])


def chunk_local_cumsum(g):
  """Inclusive cumsum of [..., C] gates within each chunk, in float32."""
  return jnp.cumsum(g.astype(F32), axis=-1)


def causal_mask(C: int, strict: bool = False):
  return jnp.tril(jnp.ones((C, C), bool), -1 if strict else 0)


def decay_matrix(gc, strict: bool = False, gq=None):
  """exp(gq_i - gc_j) on the (strictly) lower triangle, 0 above: [..., C] -> [..., C, C].

  `gq` (default `gc`) is the query-side cumsum (see `gated_scores`). The mask is applied before the
  exp so that a positive difference is never exponentiated.
  """
  C = gc.shape[-1]
  diff = (gc if gq is None else gq)[..., :, None] - gc[..., None, :]
  return jnp.exp(jnp.where(causal_mask(C, strict), diff, -jnp.inf))


def unit_lower_inverse(A, base: int = 16):
  """(I + A)^-1 for strictly lower-triangular A [..., C, C], in float32 (the WY/UT transform).

  Blockwise, as a triangular solve works: [[M11, 0], [M21, M22]]^-1 has diagonal blocks M11^-1 and
  M22^-1 and lower block -M22^-1 M21 M11^-1, recursing down to `base`-sized diagonal blocks, which
  use (I + N)^-1 = (I - N)(I + N^2)(I + N^4)... (N nilpotent). Only matmuls: no LAPACK custom call,
  which on multi-device CPU meshes can deadlock against collectives, and fast on accelerators.
  """
  A = A.astype(F32)
  C = A.shape[-1]
  hi = lax.Precision.HIGHEST
  if C <= base or C % 2:
    eye = jnp.eye(C, dtype=F32)
    power, inv = -A, eye - A
    for _ in range(max(0, (C - 1).bit_length() - 1)):
      power = jnp.matmul(power, power, precision=hi)
      inv = jnp.matmul(inv, eye + power, precision=hi)
    return inv
  h = C // 2
  t11 = unit_lower_inverse(A[..., :h, :h], base)
  t22 = unit_lower_inverse(A[..., h:, h:], base)
  t21 = -jnp.matmul(t22, jnp.matmul(A[..., h:, :h], t11, precision=hi), precision=hi)
  zeros = jnp.zeros_like(t21)
  return jnp.concatenate([jnp.concatenate([t11, zeros], -1), jnp.concatenate([t21, t22], -1)], -2)


def l2norm(x, eps: float = 1e-6):
  """x / ||x|| over the last axis, computed in float32, returned in x's dtype."""
  xf = x.astype(F32)
  return (xf * lax.rsqrt(jnp.sum(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def gated_scores(a, b, gc, dtype, strict: bool = False, sub: int = 16, gq=None):
  """Decayed intra-chunk scores: sum_c a[i,c] b[j,c] exp(gq[i,c] - gc[j,c]) for j <= i (j < i if
  `strict`), zero above the diagonal. a, b: [..., C, K]; gc: chunk-local cumsum [..., C, K] for
  per-channel gates or [..., C, 1] for a scalar gate. Returns float32 [..., C, C].
  `gq` (same shape, default `gc`) is the query-side cumsum: RWKV-6 reads the state before its own
  token and passes the exclusive cumsum with strict=True. It must be non-increasing in i with
  gq[i] <= gc[j] for every unmasked j < i, so no exponent below is positive.

  Scalar gates factor out of the sum. Per-channel gates do not, and exp(gc_i) * exp(-gc_j) can
  overflow, so the chunk is split into sub-chunks of `sub`: across sub-chunks both factors are taken
  relative to the first position r of the query sub-chunk (gc_i <= gc_r <= gc_j, so both exps are
  <= 1), within a sub-chunk the [sub, sub, K] product is formed with the mask applied before the exp.
  """
  C = a.shape[-2]
  gq = gc if gq is None else gq
  if gc.shape[-1] == 1:
    return mm("...ik,...jk->...ij", a, b, dtype) * decay_matrix(gc[..., 0], strict, gq[..., 0])
  sub = sub if C % sub == 0 else C
  n = C // sub
  lead = a.shape[:-2]
  blocks = lambda x: x.reshape(*lead, n, sub, x.shape[-1])
  ab, bb, gb, gqb = blocks(a.astype(F32)), blocks(b.astype(F32)), blocks(gc), blocks(gq)
  # Across sub-chunks: query block p against every key j < r_p = p * sub.
  g_ref = gqb[..., :, :1, :]                                            # [..., n, 1, K]
  a_rel = ab * jnp.exp(gqb - g_ref)                                     # <= 1
  before = (jnp.arange(C)[None, :] < (jnp.arange(n) * sub)[:, None])    # [n, C]
  expo = jnp.where(before[..., None], g_ref - gc[..., None, :, :], -jnp.inf)  # [..., n, C, K]
  b_rel = b[..., None, :, :].astype(F32) * jnp.exp(expo)
  across = mm("...pik,...pjk->...pij", a_rel, b_rel, dtype)              # [..., n, sub, C]
  # Within a sub-chunk: explicit [sub, sub, K] products, masked before the exp.
  mask = causal_mask(sub, strict)
  expo = jnp.where(mask[..., None], gqb[..., :, None, :] - gb[..., None, :, :], -jnp.inf)
  within = jnp.einsum("...ik,...jk,...ijk->...ij", ab, bb, jnp.exp(expo),
                      precision=precision_for(dtype))                   # [..., n, sub, sub]
  out = across
  for p in range(n):
    out = out.at[..., p, :, p * sub:(p + 1) * sub].add(within[..., p, :, :])
  return out.reshape(*lead, C, C)
