"""In-kernel math of the Pallas GPU stage kernels (Triton lowering): functions of loaded values and
refs, called inside kernel bodies. 2-D matmuls with a float32 accumulator, causal masks and decays,
row scaling, the chunk kernels' loop over value tiles, the varlen state hand-overs of the state
passes, and the unit-lower-triangular inverse of the delta rule's WY/UT transform (family-free
linear algebra; the transform itself lives in pallas_kernels/gated_delta_rule/gpu.py).

Triton's limits shape these helpers: dots are 2-D with every dim >= 16 (hence the 16 x 16 blocks of
the inverse), and float32 x float32 dots run as tf32 unless the precision is HIGHEST (IEEE), which
the float32-input paths ask for through `precision`.
"""
from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

F32 = jnp.float32
SUB = 16  # diagonal block of the triangular inverse (Triton's smallest dot tile)


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


def intra_chunk_scores(qs, ks, G, scale, prec=None):
  """P = lower(scale q k^T exp(G_i - G_j)), float32 [C, C], of a chunk with scalar gates G [C]; q
  and k as lists of key-row blocks (`key_blocks`; one block: [q], [k]), their products summed."""
  return total([dot_nt(q, k, prec) for q, k in zip(qs, ks)]) * (decay(G) * scale)


def scale_rows(x, s, dtype=None):
  """diag(s) x in float32, optionally cast to `dtype` (a matmul operand)."""
  y = x.astype(F32) * s[:, None]
  return y if dtype is None else y.astype(dtype)


def decay_state(S, g_last):
  """The state S [K, BV] decayed by exp(g_last): g_last a scalar, or [K] (one decay per key row)."""
  d = jnp.exp(g_last)
  return S * (d[:, None] if jnp.ndim(d) == 1 else d)


def chunk_gates(g_ref, t0, C):
  """(G, G_C) of the chunk of C tokens at t0 from the whole-sequence gate block: G [C] and G_C a
  scalar (scalar gates, g_ref [T]), or G [C, K] and G_C [K] (per-channel gates, g_ref [T, K])."""
  if len(g_ref.shape) == 1:
    return g_ref[pl.ds(t0, C)], g_ref[t0 + C - 1]
  return g_ref[pl.ds(t0, C), :], g_ref[t0 + C - 1, :]


def over_value_tiles(V: int, bv: int, unrolled: int, body, carry=()):
  """carry = body(cols, carry) for the value tiles cols = pl.ds(j bv, bv) of V columns (bv divides
  V), in order: unrolled when V <= `unrolled` (Config.unrolled_value_columns), else a `fori_loop`
  (one copy of the tile code, so a wide V, which runs in the same program to compute its
  V-independent work once, costs no more registers or compile time than a narrow one)."""
  if V % bv:
    raise ValueError(f"value tile {bv} does not divide V={V}")
  if V <= unrolled:
    for j in range(V // bv):
      carry = body(pl.ds(j * bv, bv), carry)
    return carry
  return lax.fori_loop(0, V // bv, lambda j, c: body(pl.ds(pl.multiple_of(j * bv, bv), bv), c),
                       carry)


def at_last(x, value):
  """Adds `value` to the last row of x: x [C] and a scalar, or x [C, D] and value [D]."""
  return x + jnp.where(iota(x.shape, 0) == x.shape[0] - 1, value, 0.0)


def key_blocks(K: int, bk: int):
  """The row slices of a state [K, BV] held as blocks of bk key rows (one block when K <= bk): the
  state passes keep a list of [bk, BV] blocks and split every product over K the same way, so no
  operand wider than bk keys is formed."""
  bk = min(bk, K)
  if K % bk:
    raise ValueError(f"key block {bk} does not divide K={K}")
  return [pl.ds(i * bk, bk) for i in range(K // bk)]


def total(parts):
  """The sum of a product's per-key-block parts (one part: that part itself)."""
  return functools.reduce(operator.add, parts)


def state_at_flag(i, load, state):
  """load(i), the state of sequence i, when a chunk's varlen flag i (`varlen.ChunkLayout.segments`:
  the sequence a chunk starts, else -1) is set, else `state`: a state pass entering sequence i."""
  return lax.cond(i >= 0, lambda: load(jnp.maximum(i, 0)), lambda: state)


def store_at_flag(i, store):
  """store(i) when a chunk's varlen flag i is set (>= 0): a state pass leaving sequence i."""

  @pl.when(i >= 0)
  def _():
    store(jnp.maximum(i, 0))


def walk_chunks(NT, body, init_ref, final_ref, rows, is_varlen):
  """The chunk loop of a state pass over a state held as key-row blocks `rows`: S = body(i, S) for
  i < NT, from init_ref [K, BV] (float32) with the last S written to final_ref (when not None);
  with varlen from zeros, each sequence's state entered and left at its flagged chunks inside
  `body` (`state_at_flag`, `store_at_flag`), init_ref and final_ref [N, K, BV]. A sequence without
  tokens has no flagged chunk and leaves as it entered: every final state starts as the initial
  one. (Aliasing the initial states to the final-state output instead makes XLA copy them into
  each call's output buffer, a copy per layer that it may schedule long before the layer runs.)"""
  if is_varlen:
    if final_ref is not None:
      def copy(n, carry):
        for r in rows:
          final_ref[n, r, :] = init_ref[n, r, :].astype(final_ref.dtype)
        return carry
      lax.fori_loop(0, init_ref.shape[0], copy, 0)
    S0 = [jnp.zeros((r.size, init_ref.shape[-1]), F32) for r in rows]
  else:
    S0 = [init_ref[r, :].astype(F32) for r in rows]
  S = lax.fori_loop(0, NT, body, S0)
  if final_ref is not None and not is_varlen:
    for r, s in zip(rows, S):
      final_ref[r, :] = s


def read_blocks(states_ref, rows):
  """The `state_at_flag` load of a state held as key-row blocks: i -> the blocks `rows` of
  states_ref[i] [K, BV], float32."""
  return lambda i: [states_ref[i, r, :].astype(F32) for r in rows]


def write_blocks(states_ref, rows, S):
  """The `store_at_flag` store of a state held as key-row blocks: i -> states_ref[i] = S."""
  def store(i):
    for r, s in zip(rows, S):
      states_ref[i, r, :] = s
  return store


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
  cross-thread row extractions cost more than the dots: 0.18 of the WY kernel's 0.43 ms on the
  H200 at B=4 T=4096 H=16 K=V=128), then the merge
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
