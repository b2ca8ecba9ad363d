"""In-kernel building blocks for the Mosaic TPU chunk kernels (2-D values of one chunk of one head).

Only constructs Mosaic lowers directly are used: 2-D `dot_general` (plain or with one operand
transposed) with a float32 result, iota masks, `where`, `exp`, reductions along one axis and
`fori_loop`. No dynamic slicing of values: a row or column is taken with a masked reduction.
Float32 operands run at precision HIGHEST (Mosaic's fp32 contract precision), so float32 products
are never truncated to bfloat16.

Shape legend: C chunk length, K key dim, V value dim, Kg = 1 (scalar gate) or K (per-channel gate).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

F32 = jnp.float32
SUB = 16  # sub-chunk for per-channel decays and for the blocked triangular inverse


def dot(a, b, dtype, ta: bool = False, tb: bool = False):
  """a @ b (a^T if `ta`, b^T if `tb`) with both operands cast to `dtype` and a float32 result."""
  dtype = jnp.dtype(dtype)
  prec = lax.Precision.HIGHEST if dtype == jnp.float32 else lax.Precision.DEFAULT
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return lax.dot_general(a.astype(dtype), b.astype(dtype), dims, precision=(prec, prec),
                         preferred_element_type=F32)


def iota(shape, dim):
  return lax.broadcasted_iota(jnp.int32, shape, dim)


def masked_exp(x, mask):
  """exp(x) where `mask`, else 0; the mask is applied before the exp (no overflow, no inf)."""
  return jnp.where(mask, jnp.exp(jnp.where(mask, x, 0.0)), 0.0)


def row(x, r):
  """Row r of [M, D] as [1, D] (r may be traced)."""
  return jnp.sum(jnp.where(iota(x.shape, 0) == r, x, 0.0), axis=0, keepdims=True)


def col(x, c):
  """Column c of [M, D] as [M, 1] (c may be traced)."""
  return jnp.sum(jnp.where(iota(x.shape, 1) == c, x, 0.0), axis=1, keepdims=True)


def row_to_col(x):
  """[1, D] -> [D, 1]."""
  D = x.shape[1]
  return jnp.sum(jnp.where(iota((D, D), 0) == iota((D, D), 1), x, 0.0), axis=1, keepdims=True)


def col_to_row(x):
  """[D, 1] -> [1, D]."""
  D = x.shape[0]
  return jnp.sum(jnp.where(iota((D, D), 0) == iota((D, D), 1), x, 0.0), axis=0, keepdims=True)


def as_col(x):
  """A chunk's per-token scalars as a column [C, 1] (from a (1, C) row block); [C, K] passes."""
  return row_to_col(x) if x.shape[0] == 1 else x


def like(dx, x):
  """A gradient [C, 1] or [C, K] in the block layout of its input x (a column back to a row)."""
  return col_to_row(dx) if x.shape[0] == 1 else dx


def causal(C: int, strict: bool):
  i, j = iota((C, C), 0), iota((C, C), 1)
  return i > j if strict else i >= j


def unit_lower_inverse(A):
  """(I + A)^-1 for strictly lower-triangular float32 A [C, C] (C a multiple of 16), in float32.

  Forward substitution inside the 16x16 diagonal blocks (all blocks at once, one row each step),
  then the block-lower remainder by a terminating Neumann product: with X = (I + D)^-1 for the
  block-diagonal part D and M = X (A - D) (nilpotent, M^n = 0 for n = C / 16 blocks),
  (I + A)^-1 = (I + M)^-1 X = (I - M)(I + M^2)(I + M^4)... X.
  """
  C = A.shape[0]
  sub = min(SUB, C)
  r, c = iota((C, C), 0), iota((C, C), 1)
  same = lax.div(r, sub) == lax.div(c, sub)
  D = jnp.where(same, A, 0.0)
  eye = jnp.where(r == c, 1.0, 0.0).astype(F32)
  local = lax.rem(r, sub)

  def subst(i, X):
    return jnp.where(local == i, eye - dot(D, X, F32), X)

  X = lax.fori_loop(0, sub, subst, jnp.zeros((C, C), F32))
  n = C // sub
  if n == 1:
    return X
  M = dot(X, A - D, F32)
  P, power, span = X, M, 1          # P = (I + M^2)(I + M^4)...(I + M^span) X
  while 2 * span < n:
    power = dot(power, power, F32)  # M^(2 span)
    P = P + dot(power, P, F32)
    span *= 2
  return P - dot(M, P, F32)


class Decay:
  """Decayed intra-chunk products with chunk-local log-decay cumsums Gq (query side) and Gk (key
  side), [C, Kg]; entry (i, j) carries exp(Gq_i - Gk_j), which must be <= 1 for j <= i.

  scores(a, b)[i, j] = sum_c a_ic b_jc exp(Gq_ic - Gk_jc)       (masked causal)  [C, C]
  left(M, b)[i]      = sum_j M_ij b_j * exp(Gq_i - Gk_j)                       [C, K]
  right(M, a)[j]     = sum_i M_ij a_i * exp(Gq_i - Gk_j)                       [C, K]
  (M is already zero above the diagonal.) `strict` (RWKV-6: the query reads the state before its
  token) drops the diagonal everywhere, where exp(Gq_i - Gk_i) may exceed 1. A scalar gate factors out of the sum. A per-channel
  gate does not, and exp(Gq_i) exp(-Gk_j) can overflow, so: across 16-row sub-chunks both factors
  are taken relative to the key cumsum just before the query sub-chunk (both exponents <= 0);
  inside a sub-chunk the terms are formed column by column with the mask applied before the exp.
  """

  def __init__(self, Gq, Gk, dtype, strict: bool = False):
    self.Gq, self.Gk, self.dtype, self.strict = Gq, Gk, jnp.dtype(dtype), strict
    self.C = Gq.shape[0]
    self.scalar = Gq.shape[1] == 1
    if self.scalar:
      self.D = masked_exp(Gq - col_to_row(Gk), causal(self.C, strict))  # [C, C]
    else:
      self.sub = min(SUB, self.C)
      self.blk = lax.div(iota((self.C, 1), 0), self.sub)

  def scores(self, a, b, strict: bool = False):
    C, strict = self.C, strict or self.strict
    if self.scalar:
      return dot(a, b, self.dtype, tb=True) * jnp.where(causal(C, strict), self.D, 0.0)
    out = jnp.zeros((C, C), F32)
    for q_rel, k_rel in self._across():
      out += dot(a * q_rel, b * k_rel, self.dtype, tb=True)
    a, b = a.astype(F32), b.astype(F32)
    cols = iota((C, C), 1)

    def body(j, out):
      e = self._within(j, strict)
      c = jnp.sum(a * row(b, j) * e, axis=1, keepdims=True)
      return out + jnp.where(cols == j, c, 0.0)

    return lax.fori_loop(0, C, body, out)

  def left(self, M, b):
    if self.scalar:
      return dot(M * self.D, b, self.dtype)
    out = jnp.zeros((self.C, b.shape[1]), F32)
    for q_rel, k_rel in self._across():
      out += q_rel * dot(M, b * k_rel, self.dtype)
    b = b.astype(F32)

    def body(j, out):
      return out + col(M, j) * row(b, j) * self._within(j, self.strict)

    return lax.fori_loop(0, self.C, body, out)

  def right(self, M, a):
    if self.scalar:
      return dot(M * self.D, a, self.dtype, ta=True)
    out = jnp.zeros((self.C, a.shape[1]), F32)
    for q_rel, k_rel in self._across():
      out += k_rel * dot(M, a * q_rel, self.dtype, ta=True)
    a = a.astype(F32)
    rows = iota((self.C, 1), 0)

    def body(j, out):
      r = jnp.sum(col(M, j) * a * self._within(j, self.strict), axis=0, keepdims=True)
      return out + jnp.where(rows == j, r, 0.0)

    return lax.fori_loop(0, self.C, body, out)

  def _across(self):
    """Per query sub-chunk p >= 1: (exp(Gq_i - ref) on its rows, exp(ref - Gk_j) on rows j < p*sub),
    ref = Gk at row p*sub - 1; both [C, K], zero elsewhere."""
    rows = iota((self.C, 1), 0)
    for p in range(1, self.C // self.sub):
      ref = row(self.Gk, p * self.sub - 1)
      yield (masked_exp(self.Gq - ref, self.blk == p), masked_exp(ref - self.Gk, rows < p * self.sub))

  def _within(self, j, strict: bool):
    """exp(Gq_i - Gk_j) for rows i in j's sub-chunk with i >= j (i > j if strict), else 0: [C, K]."""
    rows = iota((self.C, 1), 0)
    mask = (self.blk == lax.div(j, self.sub)) & ((rows > j) if strict else (rows >= j))
    return masked_exp(self.Gq - row(self.Gk, j), mask)


def state_decay(kf, G):
  """For S_next = diag(exp(G_C)) S + k_out^T v: (G_C [1, Kg], k_out = k exp(G_C - G) [C, K],
  exp(G_C) as a column [Kg, 1] that scales the rows of S)."""
  G_last = row(G, G.shape[0] - 1)
  return G_last, kf * jnp.exp(G_last - G), jnp.exp(row_to_col(G_last))


def state_gate_grad(dG, dk_out, k_out, S, dS, G_last):
  """Adds to the per-channel gate-cumsum gradient dG [C, K] the part through S_next = diag(exp(G_C))
  S + k_out^T v (dk_out = dL/dk_out, dS = dL/dS_next) and reduces it to the gate's width [C, Kg]."""
  kk = dk_out * k_out
  dG = dG - kk
  last = jnp.sum(kk, axis=0, keepdims=True)                  # [1, K]
  dgamma = jnp.sum(S * dS, axis=1, keepdims=True)            # [K, 1]
  if G_last.shape[1] == 1:
    dG = jnp.sum(dG, axis=1, keepdims=True)
    last = jnp.sum(last, axis=1, keepdims=True) + jnp.sum(dgamma, axis=0, keepdims=True) * jnp.exp(G_last)
  else:
    last = last + col_to_row(dgamma) * jnp.exp(G_last)
  return dG + jnp.where(iota(dG.shape, 0) == dG.shape[0] - 1, last, 0.0)


def shift_rows(x, s: int, reverse: bool = False):
  """Row t of the result is row t - s of x (t + s if `reverse`); rows without one wrap around and
  must be masked by the caller. A sublane rotation (pltpu.roll), no slicing."""
  C = x.shape[0]
  return pltpu.roll(x, C - s if reverse else s, 0)


def decayed_prefix(x, G, reverse: bool = False):
  """h_t = sum_{j <= t} exp(G_t - G_j) x_j (sum_{j >= t} exp(G_j - G_t) x_j if `reverse`) over the
  rows of x [C, D] with the chunk-local log-decay cumsum G [C, D] (or None: no decay), by log2(C)
  doubling steps (Hillis-Steele); every exponent is <= 0."""
  C = x.shape[0]
  rows = iota((C, 1), 0)
  s = 1
  while s < C:
    has = (rows < C - s) if reverse else (rows >= s)
    term = shift_rows(x, s, reverse)
    if G is not None:
      Gs = shift_rows(G, s, reverse)
      term = term * masked_exp(Gs - G if reverse else G - Gs, has)
    x = x + jnp.where(has, term, 0.0)
    s *= 2
  return x
