"""The state-kernel runner: every Mosaic chunk kernel that carries a state across the chunk axis
runs through `run`, so a family writes only its per-chunk forward and backward (a `StateKernel`) and
never a pallas_call, a BlockSpec or a custom_vjp.

Every grid is (batch, head, chunk) with dimension semantics ("parallel", "parallel", "arbitrary"):
the chunk axis is sequential, so a float32 VMEM scratch carries the state from one chunk to the
next. The plan's two int32 arrays [N] (`layout.Plan.seq` and `.flags`) ride along as scalar prefetch
(`pltpu.PrefetchScalarGridSpec`), so index maps address the state block of each chunk's sequence and
kernels load initial states and final-state cotangents where sequences start and end. The forward
kernel also writes every chunk-start state when gradients are taken; the backward kernel walks the
chunks in reverse through its index maps, reading them, with dS in VMEM.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common.cost import kernel_cost
from pallas_kernels.common.tpu.layout import END, F32, START, Plan

SEMANTICS = ("parallel", "parallel", "arbitrary")


def interpret_params(interpret):
  """False -> compile for TPU; True -> TPU interpret mode on any host, with out-of-bounds reads
  raising and uninitialised memory read as NaN (so a kernel that reads what it never wrote fails);
  an `InterpretParams` instance passes through."""
  if not interpret or isinstance(interpret, pltpu.InterpretParams):
    return interpret
  want = dict(out_of_bounds_reads="raise", uninitialized_memory="nan")
  have = {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
  return pltpu.InterpretParams(**{k: v for k, v in want.items() if k in have})


def compiler_params():
  return pltpu.CompilerParams(dimension_semantics=SEMANTICS)


# --- BlockSpecs (index maps receive the grid indices, then the two scalar-prefetch refs) ----------

def chunk_spec(C: int, D: int, reverse: bool = False, N: int = 0):
  """Chunk n (or N-1-n when walking backwards) of one head of a [B, H, N*C, D] array."""
  if reverse:
    return pl.BlockSpec((None, None, C, D), lambda b, h, n, seq, fl: (b, h, N - 1 - n, 0))
  return pl.BlockSpec((None, None, C, D), lambda b, h, n, seq, fl: (b, h, n, 0))


def row_spec(C: int, reverse: bool = False, N: int = 0):
  """Chunk n (or N-1-n) of a [B, H, N, 1, C] row array (see `layout.to_rows`)."""
  if reverse:
    return pl.BlockSpec((None, None, None, 1, C), lambda b, h, n, seq, fl: (b, h, N - 1 - n, 0, 0))
  return pl.BlockSpec((None, None, None, 1, C), lambda b, h, n, seq, fl: (b, h, n, 0, 0))


def state_spec(shape, reverse: bool = False, N: int = 0):
  """The state block [*shape] of the sequence chunk n belongs to, in a [n_seq, H, *shape] array."""
  zeros = (0,) * len(shape)
  if reverse:
    return pl.BlockSpec((None, None, *shape), lambda b, h, n, seq, fl: (b + seq[N - 1 - n], h, *zeros))
  return pl.BlockSpec((None, None, *shape), lambda b, h, n, seq, fl: (b + seq[n], h, *zeros))


def per_chunk_spec(shape, reverse: bool = False, N: int = 0):
  """A [*shape] block per chunk of a [B, H, N, *shape] array (e.g. the chunk-start states)."""
  zeros = (0,) * len(shape)
  if reverse:
    return pl.BlockSpec((None, None, None, *shape), lambda b, h, n, seq, fl: (b, h, N - 1 - n, *zeros))
  return pl.BlockSpec((None, None, None, *shape), lambda b, h, n, seq, fl: (b, h, n, *zeros))


def head_spec(shape):
  """The block of head h of a per-head parameter [H, *shape] (e.g. RWKV-6's bonus u as [H, 1, K])."""
  zeros = (0,) * len(shape)
  return pl.BlockSpec((None, *shape), lambda b, h, n, seq, fl: (h, *zeros))


def call(kernel, grid, seq, flags, in_specs, out_specs, out_shape, scratch_shapes, interpret, name):
  """pallas_call over `grid` = (B, H, N) with (seq, flags) as scalar prefetch."""
  grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
                                           out_specs=out_specs, scratch_shapes=scratch_shapes)

  call = functools.partial(pl.pallas_call, kernel, out_shape=out_shape, grid_spec=grid_spec,
                           compiler_params=compiler_params(), interpret=interpret_params(interpret),
                           name=name)
  return lambda *args: call(cost_estimate=kernel_cost(call(), seq, flags, *args))(seq, flags, *args)


def passthrough_empty(final, h0, empty):
  """Sequences without tokens keep their initial state (the kernels never visit them)."""
  return jnp.where(empty.reshape(-1, *[1] * (final.ndim - 1)), h0, final)


# --- in-kernel state handling shared by the chunk kernels --------------------------------------

def load_initial_state(S_ref, h0_ref, flags_ref):
  """Forward, at the top of each grid step: a sequence starting at this chunk loads its state."""
  @pl.when((flags_ref[pl.program_id(2)] & START) != 0)
  def _():
    S_ref[...] = h0_ref[...]


def load_final_state_grad(dS_ref, dfinal_ref, flags_ref, N: int):
  """Backward (chunks in reverse): dS starts at zero and is reset to the final-state cotangent of a
  sequence ending at this chunk."""
  n = pl.program_id(2)

  @pl.when(n == 0)
  def _():
    dS_ref[...] = jnp.zeros_like(dS_ref)

  @pl.when((flags_ref[N - 1 - n] & END) != 0)
  def _():
    dS_ref[...] = dfinal_ref[...]


def shapes_like(*xs):
  return [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]


# --- one runner for every chunk kernel that carries a state across the chunk axis ----------------

class StateKernel(NamedTuple):
  """A family's chunk computation, written on the values of one chunk of one head.

  forward(st, xs, S) -> (o [C, V], S_next); backward(st, xs, S, do, dS_next) -> (grads, dS), grads
  for the chunk inputs (the rank-4 arrays [B, H, N*C, D] and rank-5 rows [B, H, N, 1, C] of `xs`,
  which come first; a kernel sees [C, D] and [1, C] blocks) in their order. Rank-3 inputs
  [H, 1, D] are per-head parameters; `head_grads(st, xs, do)` returns their cotangents (computed
  outside the kernel). The state S is one float32 array or a tuple of them (as the initial state
  passed to `run` is). `st` is a hashable NamedTuple with at least N, C and interpret.
  """
  name: str
  forward: Callable
  backward: Callable
  head_grads: Callable | None = None


def _specs(st, xs, reverse=False):
  def spec(x):
    if x.ndim == 5:
      return row_spec(st.C, reverse, st.N)
    if x.ndim == 4:
      return chunk_spec(st.C, x.shape[-1], reverse, st.N)
    return head_spec(x.shape[1:])
  return [spec(x) for x in xs]


def _split(refs, *sizes):
  out, i = [], 0
  for n in sizes:
    out.append(refs[i:i + n])
    i += n
  return out


def _forward_kernel(kern, st, n_in, n_s, tup, with_states, seq_ref, flags_ref, *refs):
  del seq_ref
  ins, h0s, (o_ref,), finals, states, Ss = _split(refs, n_in, n_s, 1, n_s, n_s if with_states else 0,
                                                  n_s)
  for S_ref, h0_ref in zip(Ss, h0s):
    load_initial_state(S_ref, h0_ref, flags_ref)
  S = tuple(r[...] for r in Ss)
  for ref, x in zip(states, S):
    ref[...] = x
  o, S = kern.forward(st, tuple(r[...] for r in ins), S if tup else S[0])
  o_ref[...] = o.astype(o_ref.dtype)
  for S_ref, final_ref, x in zip(Ss, finals, S if tup else (S,)):
    S_ref[...] = x
    final_ref[...] = x


def _backward_kernel(kern, st, n_in, n_s, n_g, tup, seq_ref, flags_ref, *refs):
  del seq_ref
  ins, S_in, (do_ref,), dfinals, grad_refs, dh0s, dSs = _split(refs, n_in, n_s, 1, n_s, n_g, n_s, n_s)
  for dS_ref, dfinal_ref in zip(dSs, dfinals):
    load_final_state_grad(dS_ref, dfinal_ref, flags_ref, st.N)
  S, dS = tuple(r[...] for r in S_in), tuple(r[...] for r in dSs)
  grads, dS = kern.backward(st, tuple(r[...] for r in ins), S if tup else S[0], do_ref[...],
                            dS if tup else dS[0])
  for ref, x in zip(grad_refs, grads):
    ref[...] = x.astype(ref.dtype)
  for dS_ref, dh0_ref, x in zip(dSs, dh0s, dS if tup else (dS,)):
    dS_ref[...] = x
    dh0_ref[...] = x


def _forward(kern, st, tup, seq, flags, xs, h0s, with_states):
  B, H, Tp = xs[0].shape[:3]
  shapes = [h.shape[2:] for h in h0s]
  V = shapes[0][-1]
  out_specs = [chunk_spec(st.C, V)] + [state_spec(s) for s in shapes]
  out_shape = [jax.ShapeDtypeStruct((B, H, Tp, V), xs[0].dtype)] + shapes_like(*h0s)
  if with_states:
    out_specs += [per_chunk_spec(s) for s in shapes]
    out_shape += [jax.ShapeDtypeStruct((B, H, st.N, *s), F32) for s in shapes]
  kernel = functools.partial(_forward_kernel, kern, st, len(xs), len(h0s), tup, with_states)
  outs = call(kernel, (B, H, st.N), seq, flags, _specs(st, xs) + [state_spec(s) for s in shapes],
              out_specs, out_shape, [pltpu.VMEM(s, F32) for s in shapes], st.interpret,
              kern.name + "_fwd")(*xs, *h0s)
  n = len(h0s)
  return outs[0], tuple(outs[1:1 + n]), tuple(outs[1 + n:])


def _backward(kern, st, seq, flags, xs, states, do, dfinal, tup):
  B, H = xs[0].shape[:2]
  N, shapes = st.N, [s.shape[2:] for s in dfinal]
  chunk_xs = [x for x in xs if x.ndim >= 4]
  in_specs = (_specs(st, xs, True) + [per_chunk_spec(s, True, N) for s in shapes]
              + [chunk_spec(st.C, do.shape[-1], True, N)] + [state_spec(s, True, N) for s in shapes])
  out_specs = _specs(st, chunk_xs, True) + [state_spec(s, True, N) for s in shapes]
  kernel = functools.partial(_backward_kernel, kern, st, len(xs), len(shapes), len(chunk_xs), tup)
  outs = call(kernel, (B, H, N), seq, flags, in_specs, out_specs,
              shapes_like(*chunk_xs, *dfinal), [pltpu.VMEM(s, F32) for s in shapes], st.interpret,
              kern.name + "_bwd")(*xs, *states, do, *dfinal)
  return outs[:len(chunk_xs)], outs[len(chunk_xs):]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _run(kern, st, tup, seq, flags, empty, xs, h0s):
  o, final, _ = _forward(kern, st, tup, seq, flags, xs, h0s, with_states=False)
  return o, final


def _run_fwd(kern, st, tup, seq, flags, empty, xs, h0s):
  o, final, states = _forward(kern, st, tup, seq, flags, xs, h0s, with_states=True)
  return (o, final), (seq, flags, empty, xs, states)


def _run_bwd(kern, st, tup, res, cts):
  seq, flags, empty, xs, states = res
  do, dfinal = cts
  grads, dh0 = _backward(kern, st, seq, flags, xs, states, do, dfinal, tup)
  grads = list(grads)
  if kern.head_grads is not None:
    grads += list(kern.head_grads(st, xs, do))
  # Sequences without tokens are never visited by the kernel.
  dh0 = tuple(jnp.where(empty.reshape(-1, *[1] * (d.ndim - 1)), 0.0, d) for d in dh0)
  return None, None, None, tuple(grads), dh0


_run.defvjp(_run_fwd, _run_bwd)


def run(kern: StateKernel, st, p: Plan, xs, h0):
  """(o [B, H, N*C, V] in xs[0].dtype, final states like h0, float32) of the chunk kernel `kern` on
  kernel-layout inputs `xs` and initial states h0 ([n_seq, H, *S] float32, or a tuple of them; V is
  the last dim of the first), differentiable (custom_vjp: the backward kernel)."""
  tup = isinstance(h0, tuple)
  h0s = h0 if tup else (h0,)
  o, final = _run(kern, st, tup, p.seq, p.flags, p.empty, tuple(xs), h0s)
  final = tuple(passthrough_empty(f, h, p.empty) for f, h in zip(final, h0s))
  return o, final if tup else final[0]
