"""Context parallelism: one op over a sequence whose time axis is split over a mesh axis.

Inside `jax.shard_map` (or any context that binds the axis), device d of the P devices along
`context_axis` holds the contiguous slice [d T, (d + 1) T) of every [B, T, ...] input. Every family's
state update is affine in the state, so a slice acts on the state that enters it as

  S_out = A(S_in) + B

where B is the slice's final state from a zero entering state and A the slice's transition (a
decay, a K x K matrix for the delta rules; mLSTM combines (C, n, m) in log space). An op call here:

1. runs the op on the local slice with the entering state of the first local sequence left out
   (zeros; the global `initial_state` where the sequence starts on this device): o and B;
2. computes the first local segment's transition A with the family's `Transition.prefix` (the
   delta rules: in the same op call, as K extra value columns);
3. all_gathers (A, B of the last local segment, whether that segment continues from before) over
   the axis and folds them in device order: every device gets its entering state S_in;
4. adds S_in's share to the outputs of the first local segment (`Transition.correct`, linear in
   S_in), or re-runs the op from S_in when the family has no cheap correction (mLSTM);
5. with output_final_state, sums each sequence's final state from the device that holds its last
   token (psum of masked states), so every device returns the same final state.

Only (A, B) crosses devices: O(P x H x K x (K + V)) floats a layer, never activations. With P <= 8
one all_gather and a P-step fold of tiny matmuls beats a log-depth ppermute scan: one collective
instead of log2(P) dependent ones, and every device computes the same fold, so the final state is
bitwise the same everywhere without a broadcast.

cu_seqlens holds global offsets (the same array on every device); sequences may cross slices. The
local offsets are `clip(cu - start, 0, T)`: still N + 1 non-decreasing offsets from 0 to T (the
sequences outside the slice are empty here), so the backend's varlen path runs unchanged. Only the
sequence holding the first local token can enter with a state from another device; a slice whose
last segment starts on it passes on a state that does not depend on S_in (A = 0).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels.common import checks
from pallas_kernels.common.varlen import sequence_index

F32 = jnp.float32
tree_map = jax.tree_util.tree_map


class Transition(NamedTuple):
  """What context parallelism needs from a family (each family's `transition.py` defines one).

  prefix(call, args, first, scale) -> (A, Q): the transition A of the first local segment (the
    tokens where `first` [B or 1, T] is True) and Q, the per-token factor with which the entering
    state reaches the outputs (o += correct(Q, S_in)); Q None makes the op re-run from S_in.
    `call(args, initial_state, cu_seqlens)` runs the op's resolved backend.
  value_index: instead of a prefix, the position of v in args: the K x K transition of the delta
    rules rides along in the local run as K extra value columns (`with_transition_columns`).
  apply(A, B, S) -> A(S) + B, state by state (leading axis: rows of the batch, or 1 with cu_seqlens).
  correct(Q, S) -> S's share of the outputs, float32.
  zero_state(S) -> the state that contributes nothing (default zeros like S).
  """
  prefix: Callable | None
  apply: Callable
  correct: Callable | None = None
  zero_state: Callable = lambda S: tree_map(jnp.zeros_like, S)
  value_index: int | None = None


# --- transitions shared by the families ----------------------------------------------------------

def segment_decay(log_decay, first):
  """The decay of the first local segment: log_decay [B, T, ...] (natural-log decays, broadcastable
  over B) -> (g, G, A): g float32 with the tokens after the segment zeroed, G its inclusive cumsum
  over T, and A = exp(G at the end) [B, ...], the segment's total decay."""
  mask = first.reshape(first.shape + (1,) * (log_decay.ndim - 2))
  g = jnp.where(mask, log_decay.astype(F32), 0.0)
  G = jnp.cumsum(g, axis=1)
  return g, G, jnp.exp(G[:, -1])


def query_factor(q, log_decay, first, scale, exclusive: bool = False):
  """Q_t = scale q_t exp(G_t) on the first segment, 0 after it, and A: the prefix of the additive
  families, whose o_t reads S_in decayed by exp(G_t) (G_{t-1} with `exclusive`: RWKV-6 reads
  S_{t-1}). q [B, T, H, K]; log_decay [B or 1, T, H, K or 1]."""
  g, G, A = segment_decay(log_decay, first)
  mask = first[:, :, None, None]
  Q = jnp.where(mask, scale * q.astype(F32) * jnp.exp(G - g if exclusive else G), 0.0)
  return A, Q


def first_segment(x, first):
  """x [B, T, ...] with the tokens after the first local segment zeroed (first: [B or 1, T])."""
  return jnp.where(first.reshape(first.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype))


def with_transition_columns(call, args, value_index: int, state, here: Slice):
  """The local run of the delta rules, their transition riding along: v gets K zero columns and the
  state K identity columns ([S | I], I on the row of the first local sequence only). Value columns
  evolve independently (the keys, gates and write strengths are shared), so the extra columns
  compute the first segment's K x K transition P (S_out = P S_in + B) in the final state and the
  factor P_t^T (scale q_t) through which S_in reaches o_t in the output, in the same op call as o
  and B, sharing its key-side work (the chunks' WY factors); the op's own varlen resets confine them
  to the first segment. Returns (o, final states, A [R, H, K, K], Q [B, T, H, K] in o's dtype)."""
  v = args[value_index]
  K, V = args[0].shape[-1], v.shape[-1]
  # padded, not concatenated with zeros: the zeros' tangent would be saved for the backward
  wide_v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, K)])
  rows, H = state.shape[:2]
  eye = jnp.broadcast_to(jnp.eye(K, dtype=F32), (rows, H, K, K))
  if here.first_row is not None:
    eye = jnp.where((jnp.arange(rows) == here.first_row)[:, None, None, None], eye, 0.0)
  wide_args = args[:value_index] + (wide_v,) + args[value_index + 1:]
  o, S = call(wide_args, jnp.concatenate([state, eye], -1), here.cu_local)
  return o[..., :V], S[..., :V], take_row(S[..., V:], here.first_row), o[..., V:]


def apply_diagonal(A, B, S):
  """A [R, H, K] (or [R, H, 1]: one decay a head) scales the rows of S [R, H, K, V]."""
  return A[..., None] * S + B


def apply_matrix(A, B, S):
  """A [R, H, K, K] times S [R, H, K, V]."""
  return jnp.einsum("rhij,rhjv->rhiv", A, S, precision=lax.Precision.HIGHEST) + B


def correct_matrix(Q, S):
  """o_t += S^T Q_t: Q [B, T, H, K], S [B or 1, H, K, V] -> [B, T, H, V] float32."""
  return jnp.einsum("bthk,bhkv->bthv", Q.astype(F32), S, precision=lax.Precision.HIGHEST)


# --- the slice's place in the sequence -----------------------------------------------------------

def axis_size(axis: str) -> int:
  try:
    return lax.axis_size(axis)
  except NameError:
    raise ValueError(f"`context_axis={axis!r}` is not a bound mesh axis here: call the op inside "
                     "jax.shard_map (or another context that binds it) over a mesh with that axis, "
                     "with T split over it") from None


def global_length(T: int, cu_seqlens, axis: str | None) -> int:
  """The packed length that cu_seqlens must end at: T, or P x the local T under context_axis."""
  if axis is None:
    return T
  P = axis_size(axis)
  if checks.is_concrete(cu_seqlens) and getattr(cu_seqlens, "ndim", None) == 1:
    end = int(np.asarray(cu_seqlens)[-1])
    if end != P * T:
      raise ValueError(f"`cu_seqlens` holds global offsets under `context_axis={axis!r}`: it must end "
                       f"at the whole length, {P} devices x the local T = {T} = {P * T}; got {end}. "
                       "Every device's slice must have the same T.")
  return P * T


class Slice(NamedTuple):
  """This device's slice of the packed sequence. Rows are the state's leading axis: the batch
  without cu_seqlens (every row one sequence across all slices), the sequences with it."""
  index: jax.Array        # position along the axis
  cu_local: jax.Array | None
  first: jax.Array        # [B or 1, T] bool: tokens of the first local segment
  crossing: jax.Array     # bool: the first local segment continues a sequence from the previous slice
  carry: jax.Array        # bool: the last local segment does too (so its final state depends on S_in)
  first_row: jax.Array | None  # with cu_seqlens: the sequence of the first / last local token
  last_row: jax.Array | None
  ends_here: jax.Array    # [rows] bool: sequences whose last token is on this slice
  empty: jax.Array | None  # [N] bool: empty sequences (their final state is their initial state)


def locate(axis: str, T: int, cu_seqlens) -> Slice:
  P, d = axis_size(axis), lax.axis_index(axis)
  if cu_seqlens is None:
    return Slice(index=d, cu_local=None, first=jnp.ones((1, T), bool), crossing=d > 0, carry=d > 0,
                 first_row=None, last_row=None, ends_here=d == P - 1, empty=None)
  cu = cu_seqlens.astype(jnp.int32)
  start = d * T
  n0, m = sequence_index(cu, start), sequence_index(cu, start + T - 1)
  ends = cu[1:] - 1
  return Slice(
      index=d, cu_local=jnp.clip(cu - start, 0, T),
      first=(jnp.arange(T) < cu[n0 + 1] - start)[None],
      crossing=cu[n0] < start, carry=cu[m] < start, first_row=n0, last_row=m,
      ends_here=(cu[1:] > cu[:-1]) & (ends >= start) & (ends < start + T),
      empty=cu[1:] == cu[:-1])


def take_row(S, row):
  """The row `row` of every state leaf, kept as a leading axis of 1 (all rows when row is None)."""
  return S if row is None else tree_map(lambda s: lax.dynamic_slice_in_dim(s, row, 1), S)


def put_row(S, row, value, where):
  """S with row `row` (all rows when None) replaced by `value` where `where` holds."""
  if row is None:
    return tree_map(lambda s, v: jnp.where(where, v, s), S, value)
  return tree_map(lambda s, v: lax.dynamic_update_slice_in_dim(
      s, jnp.where(where, v, lax.dynamic_slice_in_dim(s, row, 1)), row, 0), S, value)


def rows_where(mask, S, other):
  """Per row of the state: S where mask [rows], else other."""
  return tree_map(lambda s, o: jnp.where(mask.reshape(mask.shape + (1,) * (s.ndim - 1)), s, o), S, other)


def varying(tree, axis: str):
  """Marks every leaf as varying over `axis` (shard_map's type of per-device values), so that a
  backend's scan carry that mixes it with local inputs keeps one type. Only shard_map's manual axes
  carry that type (a vmap axis name does not)."""
  if axis not in getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()):
    return tree

  def vary(x):
    axis_type = getattr(jax.typeof(x), "manual_axis_type", None)
    return x if axis_type is None or axis in axis_type.varying else lax.pcast(x, axis, to="varying")
  return tree_map(vary, tree)


def entering_states(transition: Transition, axis: str, A, B, carry):
  """S_in of this device: the local maps (A, B, carry) of all devices, gathered and folded in
  device order from the left (device 0 enters with nothing from another device)."""
  A_all, B_all, carry_all = lax.all_gather((A, B, carry.astype(jnp.int32)), axis)
  P = carry_all.shape[0]
  S = transition.zero_state(B)
  states = [S]
  for j in range(P - 1):
    A_j, B_j = tree_map(lambda x: x[j], (A_all, B_all))
    S = tree_map(lambda a, b: jnp.where(carry_all[j] > 0, a, b), transition.apply(A_j, B_j, S), B_j)
    states.append(S)
  return tree_map(lambda *s: jnp.stack(s)[lax.axis_index(axis)], *states)


def run(transition: Transition, call, args: tuple, initial_state, cu_seqlens, axis: str, *,
        output_final_state: bool, scale=None):
  """The op over the sequence split along `axis` (see the module docstring). `call(args,
  initial_state, cu_seqlens) -> (o, final_state)` runs the resolved backend on local arrays;
  `initial_state` is the global one (concrete, float32). Returns (o of the local slice, the global
  final state, the same on every device, or None without output_final_state)."""
  T = args[0].shape[1]
  here = locate(axis, T, cu_seqlens)
  backend = call
  call = lambda args, state, cu: backend(args, varying(state, axis), cu)
  enter_zero = put_row(initial_state, here.first_row,
                       transition.zero_state(take_row(initial_state, here.first_row)), here.crossing)
  if transition.value_index is None:
    o, S = call(args, enter_zero, here.cu_local)
    A, Q = transition.prefix(call, args, here.first, scale)
  else:
    o, S, A, Q = with_transition_columns(call, args, transition.value_index, enter_zero, here)
  S_in = entering_states(transition, axis, A, take_row(S, here.last_row), here.carry)
  if Q is None:
    o, S = call(args, put_row(initial_state, here.first_row, S_in, here.crossing), here.cu_local)
  else:
    # S_in is masked rather than its [B, T, H, V] share of o (correct is linear in S_in), and the
    # share is recomputed in the backward: the pass saves Q as it came and S_in, not a float32 Q,
    # the share and a broadcast mask (under segment parallelism the mask varies by segment), which
    # at B=1 T=32k K=256 V=512 would be 2.6x the op's own residuals.
    S_share = tree_map(lambda s, z: jnp.where(here.crossing, s, z), S_in, transition.zero_state(S_in))
    o = (o.astype(F32) + jax.checkpoint(transition.correct)(Q, S_share)).astype(o.dtype)
    first = take_row(S, here.first_row)
    S = put_row(S, here.first_row, transition.apply(A, first, S_in), here.crossing)
  if not output_final_state:
    return o, None
  rows = jax.tree_util.tree_leaves(S)[0].shape[0]
  ends_here = jnp.broadcast_to(here.ends_here, (rows,))
  final = lax.psum(rows_where(ends_here, S, tree_map(jnp.zeros_like, S)), axis)
  if here.empty is not None:
    final = rows_where(here.empty, initial_state, final)
  return o, final
