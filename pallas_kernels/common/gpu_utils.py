"""Pieces shared by the Pallas GPU kernels (Triton lowering) of every op family.

Two kinds of helpers live here:
- host side (outside kernels): compiler parameters, power-of-two padding, chunk-local cumsums in the
  head-major gate layout [B, H, T] the kernels read, and the BlockSpecs of the two grid shapes;
- kernel side (inside a kernel body, on loaded values): 2-D matmuls with a float32 accumulator,
  causal decay masks, and the unit-lower-triangular inverse of the WY/UT transform.

Triton lowering rules followed here (../../shared/PALLAS_NOTES.md): every loaded or stored block has
power-of-two dims; dots are 2-D with every dim >= 16; float32 x float32 dots run as tf32 unless the
precision is HIGHEST (IEEE), which the float32-input paths use.

Two grid shapes:
- chunk-parallel, grid (NT, B*H): one program per chunk and head; blocks [C, D] of [B, T, H, D].
- state pass, grid (B*H, V / BV): one program per head and value tile, looping over the NT chunks
  inside (`lax.fori_loop`) with the float32 state [K, BV] carried in registers; blocks span T.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

F32 = jnp.float32
SUB = 16  # diagonal block of the triangular inverse (Triton's smallest dot tile)


# --- host side -----------------------------------------------------------------------------------

def compiler_params(num_warps: int, num_stages: int):
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def next_pow2(n: int, minimum: int = 16) -> int:
  p = minimum
  while p < n:
    p *= 2
  return p


def pad_axis(x, axis: int, size: int, value=0.0):
  """Zero-pads (or `value`-pads) `axis` of x up to `size`; a no-op when already that size."""
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def head_major(x):
  """[B, T, H] -> float32 [B, H, T] (the gate layout the kernels read: contiguous per head)."""
  return jnp.swapaxes(x.astype(F32), 1, 2)


def chunk_cumsum(x, C: int, reverse: bool = False):
  """Inclusive cumsum within chunks of C along the last axis (length a multiple of C), float32."""
  shape = x.shape
  x = x.reshape(*shape[:-1], shape[-1] // C, C)
  if reverse:
    x = jnp.flip(jnp.cumsum(jnp.flip(x, -1), axis=-1), -1)
  else:
    x = jnp.cumsum(x, axis=-1)
  return x.reshape(shape)


class Specs:
  """BlockSpecs for arrays of a [B, T, H, ...] problem with H heads and chunk size C.

  `chunk_*` specs index a chunk-parallel grid (n, bh); `seq_*` specs a state-pass grid (iv, bh)
  whose blocks span the whole (padded) time axis T. The value tile iv is the first grid axis, which
  the Triton launch varies fastest: the programs of one head run side by side and share its keys
  through L2 (with bh first, at 2,048 programs they ran a wave apart and each read them from HBM).
  """

  def __init__(self, H: int, C: int, T: int):
    self.H, self.C, self.T, self.NT = H, C, T, T // C

  # tokens [B, T, H, D]
  def chunk_tok(self, D):
    H = self.H
    return pl.BlockSpec((None, self.C, None, D), lambda n, bh: (bh // H, n, bh % H, 0))

  def seq_tok(self, D, tiled=False):
    H = self.H
    if tiled:  # D is the value tile BV: block iv of the last axis
      return pl.BlockSpec((None, self.T, None, D), lambda iv, bh: (bh // H, 0, bh % H, iv))
    return pl.BlockSpec((None, self.T, None, D), lambda iv, bh: (bh // H, 0, bh % H, 0))

  # gates [B, H, T] (float32)
  def chunk_gate(self):
    H = self.H
    return pl.BlockSpec((None, None, self.C), lambda n, bh: (bh // H, bh % H, n))

  def seq_gate(self):
    H = self.H
    return pl.BlockSpec((None, None, self.T), lambda iv, bh: (bh // H, bh % H, 0))

  # per-chunk states [B, NT, H, K, V]
  def chunk_state(self, K, V):
    H = self.H
    return pl.BlockSpec((None, None, None, K, V), lambda n, bh: (bh // H, n, bh % H, 0, 0))

  def seq_state(self, K, BV):
    H = self.H
    return pl.BlockSpec((None, self.NT, None, K, BV), lambda iv, bh: (bh // H, 0, bh % H, 0, iv))

  # initial / final states [N, H, K, V]: one per program (batch b) or all N (varlen, B == 1)
  def seq_h0(self, K, BV, N=None):
    H = self.H
    if N is None:
      return pl.BlockSpec((None, None, K, BV), lambda iv, bh: (bh // H, bh % H, 0, iv))
    return pl.BlockSpec((N, None, K, BV), lambda iv, bh: (0, bh % H, 0, iv))

  # per-chunk int32 flags [NT] (varlen segment starts / ends)
  def seq_flags(self):
    return pl.BlockSpec((self.NT,), lambda iv, bh: (0,))


# --- kernel side ---------------------------------------------------------------------------------

def precision(dtype):
  """HIGHEST (IEEE float32 dots) for float32 inputs; DEFAULT otherwise (bf16 tensor cores, tf32
  for the float32 products of the triangular inverse)."""
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def dot(a, b, prec=None):
  """a [M, K] @ b [K, N] with a float32 accumulator."""
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=F32, precision=prec)


def dot_nt(a, b, prec=None):
  """a [M, K] @ b[N, K]^T."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=F32, precision=prec)


def dot_tn(a, b, prec=None):
  """a[K, M]^T @ b [K, N]."""
  return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=F32, precision=prec)


def iota(shape, dim):
  return lax.broadcasted_iota(jnp.int32, shape, dim)


def lower_mask(C: int, strict: bool = False):
  r, c = iota((C, C), 0), iota((C, C), 1)
  return r > c if strict else r >= c


def decay(G, strict: bool = False):
  """exp(G_i - G_j) on the (strictly) lower triangle, 0 above, masked before the exp. G: [C]."""
  C = G.shape[0]
  return jnp.exp(jnp.where(lower_mask(C, strict), G[:, None] - G[None, :], -jnp.inf))


def scale_rows(x, s, dtype=None):
  """diag(s) x in float32, optionally cast to `dtype` (a matmul operand)."""
  y = x.astype(F32) * s[:, None]
  return y if dtype is None else y.astype(dtype)


def at_last(x, value):
  """Adds `value` to the last entry of the vector x [C]."""
  return x + jnp.where(iota(x.shape, 0) == x.shape[0] - 1, value, 0.0)


def unit_lower_inverse_product(D):
  """(I + D)^-1 of a strictly lower-triangular float32 [16, 16] block D without serial steps: D is
  nilpotent (D^16 = 0), so (I + D)^-1 = sum_m (-D)^m = (I - D)(I + D^2)(I + D^4)(I + D^8), six dots.
  They are IEEE float32 (tf32 would lose the cancellations between the powers, whose entries can
  reach binomial sizes when the keys are nearly parallel)."""
  eye = (iota(D.shape, 0) == iota(D.shape, 1)).astype(F32)
  X, P = eye - D, D
  for _ in range(3):
    P = dot(P, P, lax.Precision.HIGHEST)
    X = X + dot(X, P, lax.Precision.HIGHEST)
  return X


def block_unit_lower_inverse(A_blocks, prec=None):
  """(I + A)^-1 of a strictly lower-triangular float32 A given as its 16 x 16 blocks.

  A_blocks[p][q] (q <= p < n) holds rows 16p.., columns 16q.. of A (diagonal blocks strictly lower).
  Returns T_blocks[p][q] (q <= p) of the inverse, float32: the diagonal blocks by
  `unit_lower_inverse_product` (six dots each; it replaced a 15-step forward substitution whose
  cross-thread row extractions cost more than the dots: benchmarks/NOTES.md, v3), then the merge
  T_pq = -T_pp sum_{q <= m < p} A_pm T_mq, one sub-diagonal at a time (16 x 16 dots).
  """
  n = len(A_blocks)
  T = [[None] * n for _ in range(n)]
  for p in range(n):
    T[p][p] = unit_lower_inverse_product(A_blocks[p][p])
  for d in range(1, n):
    for q in range(n - d):
      p = q + d
      acc = dot(A_blocks[p][q], T[q][q], prec)
      for m in range(q + 1, p):
        acc += dot(A_blocks[p][m], T[m][q], prec)
      T[p][q] = -dot(T[p][p], acc, prec)
  return T
