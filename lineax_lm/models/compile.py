"""Compile-time helpers for deep stacks of identical layers: `call_shared` runs a layer as a jitted
pure function keyed on its graphdef, so that layers of one kind share one trace and one lowering;
`scan_blocks` runs the repeats of a layer pattern as one lax.scan, so that XLA compiles the pattern
once."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, traverse_util
from jax import lax

from lineax_lm import sharding
from lineax_lm.models.config import REMAT_POLICIES
from pallas_kernels.common.gpu.config import states_kept


def call_shared(fn, module: nnx.Module, *args, remat: str | None = None, keep_states: bool = False):
  """fn(module, *args) as a pure function of the module's state, jitted with the module's graphdef
  as the cache key: identical layers (every linear block of a model, every teacher block) then share
  one trace and one lowering. A 30-layer model lowers each Pallas kernel once instead of 30 times
  (tracing and Triton lowering cost ~1 s a layer), and XLA inlines the calls, so the compiled
  program is unchanged. fn: a module-level function (its identity is part of the key) that reads
  the module's variables without updating them (updates would not be written back); remat: a
  REMAT_POLICIES name, None for none; keep_states: the ops traced inside keep their states for the
  backward (`states_kept`; part of the key, as a context read at trace time would not be)."""
  graphdef, state = nnx.split(module)
  return _pure_call(fn, graphdef, remat, keep_states, state, *args)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _pure_call(fn, graphdef, remat, keep_states, state, *args):
  def apply(state, *args):
    with states_kept(keep_states):
      return fn(nnx.merge(graphdef, state), *args)
  if remat is not None:
    apply = jax.checkpoint(apply, policy=REMAT_POLICIES[remat])
  return apply(state, *args)


def _linear_dtypes(module: nnx.Module) -> dict:
  """{path of an nnx.Linear's kernel or bias within `module`'s state: the Linear's compute dtype}:
  the parameters a Linear casts to its compute dtype before use, so that casting them earlier
  changes nothing."""
  dtypes = {}
  for path, sub in nnx.iter_graph(module):
    if isinstance(sub, nnx.Linear) and sub.dtype is not None:
      dtypes.update({(*path, "kernel"): sub.dtype, (*path, "bias"): sub.dtype})
  return dtypes


def scan_blocks(fn, blocks: list, period: int, x, *args, per_layer=None, remat: str | None = None,
                keep_states: bool = False):
  """x through fn(block, x, *args) -> x for each of `blocks` in turn, as one lax.scan over the
  repeats of a pattern of `period` blocks (1 for a pure model, 4 at "3:1"): XLA compiles the
  pattern once instead of once per layer. The per-layer parameters are stacked along a new leading
  axis inside the step (the parameter tree, and so checkpoints, are unchanged), the Linear weights
  already in their compute dtype (the cast they get anyway, before a copy of half the size); the
  gradients flow back through the stack into each layer's own leaves. `per_layer`: an array
  [len(blocks), ...] whose row i is passed to block i as fn's last argument (HGRN's lower bounds).
  fn, remat and keep_states as for `call_shared`."""
  repeats = len(blocks) // period
  graphdefs, stacked = [], []
  for j in range(period):
    graphdefs.append(nnx.graphdef(blocks[j]))
    dtypes = _linear_dtypes(blocks[j])
    layers = [traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(blocks[j + r * period])))
              for r in range(repeats)]
    stacked.append({path: jnp.stack([layer[path].astype(dtypes.get(path, layer[path].dtype))
                                     for layer in layers]) for path in layers[0]})
  rows = None if per_layer is None else per_layer.reshape(repeats, period, *per_layer.shape[1:])

  def body(x, xs):
    params, layer_rows = xs
    for j in range(period):
      extra = () if layer_rows is None else (layer_rows[j],)
      x = sharding.constrain_rows(_pure_call(fn, graphdefs[j], remat, keep_states,
                                             traverse_util.unflatten_dict(params[j]), x, *args,
                                             *extra))
    return x, None
  return lax.scan(body, x, (stacked, rows))[0]
