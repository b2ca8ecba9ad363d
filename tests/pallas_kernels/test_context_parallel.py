"""Context parallelism (`context_axis`): every op with T split over 2 or 4 of the suite's 8 fake CPU
devices inside `jax.shard_map` equals the same op unsharded, on the output, the final state (the
same on every device) and the gradients of every input and of the initial state.

The packing `CU` puts every case of a slice boundary in 64 tokens: a sequence inside a slice, an
empty one, one that ends on a slice's last token, one that crosses two (P = 4) or one (P = 2)
boundaries (so a slice holds nothing but its middle and has to pass the entering state on), and one
that starts on a slice's first token.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from tests.pallas_kernels import cases, harness

F32 = jnp.float32
T, H, K, V = 64, 2, 16, 16
CU = np.array([0, 5, 5, 10, 48, 64], np.int32)  # slices of 16 (P = 4) or 32 (P = 2) tokens
AXIS = "context"

FAMILIES = {c.name: c for c in (cases.LINEAR_ATTN, cases.RETENTION, cases.SIMPLE_GLA, cases.GLA,
                                cases.RWKV6, cases.DELTA_RULE, cases.GDN, cases.KDA, cases.HGRN,
                                cases.MLSTM)}


def draw(case, varlen: bool, seed: int = 0):
  """Inputs, initial state and the cotangents of o and the final state (float32)."""
  rng = np.random.default_rng(harness.seed_of("context", case.name, varlen, seed))
  B = 1 if varlen else 2
  N = len(CU) - 1 if varlen else B
  inputs = case.make_inputs(rng, B, T, H, K, V)
  state = case.make_state(rng, N, H, K, V)
  do = harness.normal(rng, *(case.out_shape(B, T, H, K, V) if case.out_shape else (B, T, H, V)))
  dS = jax.tree_util.tree_map(lambda s: harness.normal(rng, *s.shape), state)
  return inputs, state, (do, dS)


def sharded(case, devices: int, names, **kw):
  """case.chunk with T split over `devices` devices: (inputs, state, cu) -> (o, final_state)."""
  mesh = Mesh(np.array(jax.devices()[:devices]), (AXIS,))
  specs = tuple(P() if n in case.static_inputs else P(None, AXIS) for n in names)

  def local(xs, state, cu):
    return case.chunk(*xs, initial_state=state, output_final_state=True, cu_seqlens=cu,
                      context_axis=AXIS, **kw)
  return jax.shard_map(local, mesh=mesh, in_specs=(specs, P(), P()), out_specs=(P(None, AXIS), P()))


def unsharded(case, **kw):
  return lambda xs, state, cu: case.chunk(*xs, initial_state=state, output_final_state=True,
                                          cu_seqlens=cu, **kw)


def outputs_and_grads(case, op, inputs, state, cotangents, cu, grads: bool):
  names = list(inputs)
  xs = tuple(inputs.values())
  if not grads:
    return jax.jit(op)(xs, state, cu), None

  def loss(xs, state):
    o, S = op(xs, state, cu)
    do, dS = cotangents
    return jnp.sum(o.astype(F32) * do) + sum(
        jnp.sum(s * c) for s, c in harness.paired_leaves(S, dS, "final_state")), (o, S)
  g, out = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(xs, state)
  return out, (dict(zip(names, g[0])), g[1])


def check_context_parallel(case, devices: int, varlen: bool, grads: bool = True, tol: float = 1e-4,
                           **kw):
  """Asserts the sharded op equals the unsharded one within the float32 tolerance of DESIGN.md."""
  inputs, state, cotangents = draw(case, varlen)
  cu = jnp.asarray(CU) if varlen else None
  (o, S), g = outputs_and_grads(case, sharded(case, devices, list(inputs), **kw), inputs, state,
                                cotangents, cu, grads)
  (o_ref, S_ref), g_ref = outputs_and_grads(case, unsharded(case, backend="xla"), inputs, state,
                                            cotangents, cu, grads)
  errors = {"o": harness.rel_rms(o, o_ref)}
  for i, (a, b) in enumerate(harness.paired_leaves(S, S_ref, "final_state")):
    errors[f"final_state[{i}]"] = harness.rel_rms(a, b)
  if grads:
    for name in inputs:
      errors[f"d{name}"] = harness.rel_rms(g[0][name], g_ref[0][name])
    for i, (a, b) in enumerate(harness.paired_leaves(g[1], g_ref[1], "d_initial_state")):
      errors[f"d_initial_state[{i}]"] = harness.rel_rms(a, b)
  bad = {n: e for n, e in errors.items() if not e < tol}  # NaN fails too
  assert not bad, f"{case.name} over {devices} devices, varlen={varlen}: {bad}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_varlen_over_4_devices_matches_unsharded(family):
  check_context_parallel(FAMILIES[family], 4, varlen=True, backend="xla")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_batch_over_2_devices_matches_unsharded(family):
  check_context_parallel(FAMILIES[family], 2, varlen=False, backend="xla")
