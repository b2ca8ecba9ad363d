"""The intra-chunk pairs by levels: how the per-channel score kernels (GLA and RWKV-6 in
gla/gpu.py, KDA in kda/gpu.py) form sum_c a_ic b_jc exp(G_ic - G_jc) over the pairs j < i of a
chunk of C rows as full-chunk tensor-core dots, with no positive exponent.

At level s (C/2, C/4, ..., 1) the chunk splits into groups of 2s rows, and a pair j < i belongs to
the level whose group holds both in different halves (one level per pair: the highest bit in which
i and j differ). Both sides are taken relative to the group's reference row e, the last row of its
lower half: exp(Gq_i - G_j) = exp(Gq_i - G_e) exp(G_e - G_j), both exponents <= 0 as G does not
increase within a chunk (Gq = G, or RWKV-6's exclusive G - g, which reads the state before its
token: its row e + 1 is G_e again). So a level is one exp over [C, BK] per operand row
(`level_decay`) and one [C, C] dot per product, kept to the level's pairs (`pair_levels`,
`same_group`); the diagonal i = j has no decay (`diagonal`).

A level's pairs also fit a quarter of that dot: the C/2 rows of the upper halves against the C/2
rows of the lower halves, gathered (`level_rows`, `half_decays`), the product kept where both rows
are in one group (`one_group`). KDA's forward score kernel takes them so and stores that product in
place.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu.config import CHUNK
from pallas_kernels.common.gpu.kernel_math import iota

N_LEVELS = CHUNK.bit_length() - 1  # s = C/2, C/4, ..., 1
LEVELS = tuple(CHUNK >> i for i in range(1, N_LEVELS + 1))


def over_levels(body, carry):
  """carry = body(s, carry) for s = C/2, ..., 1 as a `fori_loop` (s traced): one copy of the level
  code (a short Triton compile), and no level's gathers or masks hoisted beside another's (the
  registers of one level at a time). A Python loop over LEVELS unrolls them instead (s static)."""
  def step(_, c):
    s, inner = c
    return s // 2, body(s, inner)
  return lax.fori_loop(0, N_LEVELS, step, (jnp.int32(CHUNK // 2), carry))[1]


def reference_rows(g_ref, cols, s):
  """[C, BK]: the gates g_ref[e, cols] at each row's reference row e (the last row of the lower
  half of its 2s-row group). With s static the C / 2s rows e are loaded strided and broadcast (a
  gather's [C, BK] pointer tensor costs registers); with s traced (`over_levels`) gathered per
  row."""
  C = g_ref.shape[0]
  if isinstance(s, int):
    n = C // (2 * s)
    G_e = g_ref[pl.ds(s - 1, n, stride=2 * s), cols]
    return jnp.broadcast_to(G_e[:, None, :], (n, 2 * s, G_e.shape[1])).reshape(C, G_e.shape[1])
  return g_ref[(iota((C,), 0) & (-2 * s)) + s - 1, cols]


def level_rows(s):
  """(upper, lower, ref) [C/2] int32 of level s (s a power of two, static or traced): the rows of
  the upper halves of its 2s-row groups in order, the lower halves' rows at the same places
  (upper - s) and each one's group reference row (the last row of the lower half)."""
  r = iota((CHUNK // 2,), 0)
  group = (r & -s) * 2
  upper = group + s + (r & (s - 1))
  return upper, upper - s, group + s - 1


def one_group(s, rows, cols):
  """[len(rows), len(cols)] bool: row rows[a] and row cols[b] in one 2s-row group of level s."""
  return (rows[:, None] & (-2 * s)) == (cols[None, :] & (-2 * s))


def half_decays(g_ref, cols, halves):
  """Level s's decays on its gathered halves, `halves` = level_rows(s): exp(G_i - G_e) [C/2, BK]
  on the rows of the upper halves and exp(G_e - G_j) on those of the lower halves, the absolute
  value as in `level_decay`."""
  upper, lower, ref = halves
  G_e = g_ref[ref, cols]
  return jnp.exp(-jnp.abs(g_ref[upper, cols] - G_e)), jnp.exp(-jnp.abs(G_e - g_ref[lower, cols]))


def level_decay(G, G_e, s, Gq=None):
  """Level s's decays [C, BK] and the [C, 1] mask of the upper-half rows: exp(Gq_i - G_e) on the
  rows of upper halves (row side), exp(G_e - G_j) on the rows of lower halves (column side), G_e
  from `reference_rows`, Gq = G unless given. One exp: each row is in exactly one half; the
  absolute value keeps a cumsum's rounding from making an exponent positive."""
  Gq = G if Gq is None else Gq
  upper = (iota((G.shape[0], 1), 0) & s) != 0   # s a power of two
  return jnp.exp(-jnp.abs(jnp.where(upper, Gq - G_e, G_e - G))), upper


def pair_levels():
  """[C, C] int32: the level s of each pair j < i, 0 on and above the diagonal; a level's pairs
  are `pair_levels() == s` (one compare, this computed once per kernel)."""
  i, j = iota((CHUNK, CHUNK), 0), iota((CHUNK, CHUNK), 1)
  x = i ^ j
  for shift in (1, 2, 4):
    x = x | (x >> shift)
  return jnp.where(i > j, x - (x >> 1), 0)


def same_group(s, X):
  """X [C, C] with the entries (i, j) of rows in different 2s-row groups zeroed: level s's pairs
  where the row side is zero off the upper halves and the column side off the lower ones."""
  if 2 * s == CHUNK:
    return X
  return jnp.where(iota((CHUNK, CHUNK), 0) // (2 * s) == iota((CHUNK, CHUNK), 1) // (2 * s), X,
                   0.0)


def diagonal():
  return iota((CHUNK, CHUNK), 0) == iota((CHUNK, CHUNK), 1)
