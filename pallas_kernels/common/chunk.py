"""Chunking helpers shared by the chunked (xla) paths.

Shape legend: B batch, T time, H heads, K key dim, V value dim, N chunks, C chunk size.
Chunked arrays are head-major, [B, H, N, C, ...], so intra-chunk products are batched matmuls.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

F32 = jnp.float32
CHUNK = 64  # tokens per chunk of every chunked path: the xla ones' default and the GPU kernels'


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


def shift_right(x, axis: int = -1, reverse: bool = False):
  """x moved one step along `axis` (x[t - 1] at t), with 0 at t = 0; with `reverse`, one step
  back (x[t + 1] at t, 0 at the end)."""
  axis = axis % x.ndim
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, 1) if reverse else (1, 0)
  start = 1 if reverse else 0
  return lax.slice_in_dim(jnp.pad(x, pad), start, start + x.shape[axis], axis=axis)


# Log-decay gates may be -inf (a decay of exactly 0) and large (|g| ~ 1e4). So every sum of gates
# below is taken over its own range, never as a difference of cumsums: (-inf) - (-inf) is NaN, and
# G_i - G_j loses all precision once |G| is large while G_i - G_j is not. A sum over its own range
# is -inf when the range holds a -inf gate (exp gives the exact 0, and its gradient 0) and is
# accurate relative to itself, so exp of it is accurate whenever it is not negligible.

# exp of any sum that holds it is exactly 0, as for -inf; a dot needs finite terms (0 * -inf = NaN).
GATE_FLOOR = -1e30


def gate_cumsum(g, axis: int = -1, reverse: bool = False):
  """Inclusive cumsum of float32 gates along a short (chunk-sized) `axis`, as a dot with a 0/1
  triangular matrix at full float32 precision. `jnp.cumsum` lowers to a reduce_window, and fused
  into its consumers on the GPU each output recomputes its whole window; a dot is one pass on the
  matrix units. Gates below GATE_FLOOR (-inf: a decay of 0) are clamped to it, so a sum over a
  range that holds one is still <= GATE_FLOOR (exp = 0) and its gradient is 0, as before."""
  axis = axis % g.ndim
  n = g.shape[axis]
  t, r = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
  tri = ((r >= t) if reverse else (r <= t)).astype(F32)                # [t, r]: r in t's range
  out = jnp.tensordot(tri, jnp.maximum(g.astype(F32), GATE_FLOOR), axes=([1], [axis]),
                      precision=lax.Precision.HIGHEST)
  return jnp.moveaxis(out, 0, axis)


def chunk_local_cumsum(g, axis: int = -1, exclusive: bool = False):
  """Cumsum of gates within each chunk along `axis`, in float32: sum_{r <= t} g_r, or with
  `exclusive` sum_{r < t} g_r (a cumsum of the shifted gates, not G - g)."""
  g = g.astype(F32)
  return gate_cumsum(shift_right(g, axis) if exclusive else g, axis=axis)


def suffix_sum(g, axis: int = -1):
  """sum_{r > t} g_r within each chunk along `axis` (the decay from t to the chunk end), float32."""
  return gate_cumsum(shift_right(g, axis, reverse=True), axis, reverse=True)


def segment_sums(g, exclusive: bool = False):
  """Per-step gates [..., C, K] -> [..., C, C, K]: D[i, j] = sum_{j < r <= i} g_r for j < i
  (sum_{j < r < i} with `exclusive`, for queries that read the state before their own token), 0 on
  and above the diagonal. A masked cumsum, so each entry sums its own range (see above)."""
  C = g.shape[-2]
  terms = jnp.where(causal_mask(C, strict=True)[..., None], g.astype(F32)[..., :, None, :], 0.0)
  D = gate_cumsum(terms, axis=-3)                                      # [..., i, j, K]
  return shift_right(D, -3) if exclusive else D


def causal_mask(C: int, strict: bool = False):
  return jnp.tril(jnp.ones((C, C), bool), -1 if strict else 0)


def decay_matrix(g, strict: bool = False, exclusive: bool = False):
  """exp(sum_{j < r <= i} g_r) on the (strictly) lower triangle, 0 above: per-step gates [..., C]
  -> [..., C, C]; `exclusive` sums r < i instead (then `strict` must be set). The mask is applied
  before the exp so that nothing above the diagonal is exponentiated."""
  C = g.shape[-1]
  D = segment_sums(g[..., None], exclusive)[..., 0]
  return jnp.exp(jnp.where(causal_mask(C, strict), D, -jnp.inf))


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


def gated_scores(a, b, g, dtype, strict: bool = False, sub: int = 16, exclusive: bool = False):
  """Decayed intra-chunk scores: sum_c a[i,c] b[j,c] exp(sum_{j < r <= i} g[r,c]) for j <= i (j < i
  if `strict`), zero above the diagonal. a, b: [..., C, K]; g: the per-step log-decay gates
  [..., C, K] per channel or [..., C, 1] scalar. Returns float32 [..., C, C].
  `exclusive` (with `strict`): the decay sums r < i, for RWKV-6, whose query reads the state before
  its own token.

  Scalar gates factor out of the sum. Per-channel gates do not, and a [C, C, K] tensor of decays
  would be large, so the chunk is split into sub-chunks of `sub`: across sub-chunks the decay from
  key j to query i is split at the query sub-chunk's first position r (i's side sums (r, i], j's
  side (j, r]; both exps <= 1), within a sub-chunk the [sub, sub, K] decays are formed directly.
  Every exponent is a non-positive sum over its own range (see `segment_sums`).
  """
  if exclusive and not strict:
    raise ValueError("gated_scores: `exclusive` decays need `strict=True` (no query reads its own key)")
  C = a.shape[-2]
  shift = int(exclusive)
  if g.shape[-1] == 1:
    return mm("...ik,...jk->...ij", a, b, dtype) * decay_matrix(g[..., 0], strict, exclusive)
  g = g.astype(F32)
  sub = sub if C % sub == 0 else C
  n = C // sub
  lead = a.shape[:-2]
  blocks = lambda x: x.reshape(*lead, n, sub, x.shape[-1])
  ab, bb, gb = blocks(a.astype(F32)), blocks(b.astype(F32)), blocks(g)
  # Across sub-chunks: query block p (first position r = p * sub) against every key j < r.
  # i's side: sum over (r - shift, i - shift] within the block, a cumsum whose first term is 0.
  first = (jnp.arange(sub) == 0)[:, None]
  a_terms = shift_right(gb, -2) if exclusive else jnp.where(first, 0.0, gb)
  a_rel = ab * jnp.exp(gate_cumsum(a_terms, axis=-2))                  # [..., n, sub, K], <= 1
  # j's side: sum over (j, r - shift], a suffix sum of the gates up to r - shift.
  pos, starts = jnp.arange(C), jnp.arange(n) * sub
  upto = (pos[None, :] <= starts[:, None] - shift)[..., None]         # [n, C, 1]
  b_sums = suffix_sum(jnp.where(upto, g[..., None, :, :], 0.0), axis=-2)  # [..., n, C, K]
  before = (pos[None, :] < starts[:, None])[..., None]                # [n, C, 1]: j < r
  b_rel = b[..., None, :, :].astype(F32) * jnp.exp(jnp.where(before, b_sums, -jnp.inf))
  across = mm("...pik,...pjk->...pij", a_rel, b_rel, dtype)              # [..., n, sub, C]
  # Within a sub-chunk: explicit [sub, sub, K] decays, masked before the exp.
  mask = causal_mask(sub, strict)
  expo = jnp.where(mask[..., None], segment_sums(gb, exclusive), -jnp.inf)
  within = jnp.einsum("...ik,...jk,...ijk->...ij", ab, bb, jnp.exp(expo),
                      precision=precision_for(dtype))                   # [..., n, sub, sub]
  out = across
  for p in range(n):
    out = out.at[..., p, :, p * sub:(p + 1) * sub].add(within[..., p, :, :])
  return out.reshape(*lead, C, C)
