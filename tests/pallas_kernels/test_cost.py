"""`kernel_cost`: the counts of known kernels, and a cost estimate on every pallas_call of every
family's chunk and decode ops (GPU and TPU), which XLA's cost analysis then sees."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.cost import kernel_cost
from tests.pallas_kernels import cases

FAMILIES = [cases.GLA, cases.RWKV6, cases.SIMPLE_GLA, cases.RETENTION, cases.LINEAR_ATTN, cases.GDN,
            cases.DELTA_RULE, cases.KDA, cases.HGRN, cases.MLSTM]


def costed(kernel, out_shape, grid, specs, *args, **kw):
  call = functools.partial(pl.pallas_call, kernel, out_shape=out_shape, grid=grid, interpret=True,
                           **specs)
  return kernel_cost(call(), *args, **kw)


def test_matmul_kernel_counts_two_flops_per_multiply_add_per_grid_step():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.exp(jnp.dot(x_ref[...], y_ref[...]))

  x, y = jnp.ones((4, 64, 32)), jnp.ones((32, 16), jnp.bfloat16)
  specs = dict(in_specs=[pl.BlockSpec((None, 64, 32), lambda i: (i, 0, 0)),
                         pl.BlockSpec((32, 16), lambda i: (0, 0))],
               out_specs=pl.BlockSpec((None, 64, 16), lambda i: (i, 0, 0)))
  cost = costed(kernel, jax.ShapeDtypeStruct((4, 64, 16), jnp.float32), (4,), specs, x, y)
  assert cost.flops == 4 * 2 * 64 * 32 * 16
  assert cost.transcendentals == 4 * 64 * 16
  assert cost.bytes_accessed == x.nbytes + y.nbytes + 4 * 64 * 16 * 4


def test_loops_count_their_body_per_trip_static_or_given():
  def kernel(n_ref, x_ref, o_ref, *, dynamic):
    hi = n_ref[0] if dynamic else 10
    o_ref[...] = lax.fori_loop(0, hi, lambda t, acc: acc + x_ref[...] * 2.0, jnp.zeros((8,)))

  n, x = jnp.array([10], jnp.int32), jnp.ones((8,))
  out = jax.ShapeDtypeStruct((8,), jnp.float32)
  # a mul and an add of 8 per trip; the while loop also adds 1 to its counter per trip
  for dynamic, trips, flops in ((False, None, 10 * 2 * 8), (True, 10, 10 * (2 * 8 + 1))):
    cost = costed(functools.partial(kernel, dynamic=dynamic), out, (1,), {}, n, x,
                  loop_trips=trips)
    assert cost.flops == flops


@pytest.mark.parametrize("case", FAMILIES, ids=lambda c: c.name)
def test_every_pallas_call_of_a_family_carries_its_flops(case):
  rng = np.random.default_rng(0)
  x = case.make_inputs(rng, 1, 128, 2, 32, 32)
  cu = jnp.array([0, 50, 128], jnp.int32)
  state = case.make_state(rng, 2, 2, 32, 32)
  names = list(x)  # the op's argument order (jax sorts dict keys)
  ops = [(case.chunk, "gpu"), (case.chunk, "tpu"), (case.fused_recurrent, "gpu")]
  for op, backend in ops:
    def loss(x, state):
      o, S = op(*(x[n] for n in names), initial_state=state, output_final_state=True, cu_seqlens=cu,
                backend=backend, interpret=True)
      return o.sum() + sum(s.sum() for s in jax.tree.leaves(S))
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, state)
    calls = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]
    assert calls, f"{op.__name__} backend={backend}: no pallas_call"
    for e in calls:
      cost = e.params["cost_estimate"]
      assert cost is not None and cost.bytes_accessed > 0, (op.__name__, backend, e.params["name"])
    assert sum(e.params["cost_estimate"].flops for e in calls) > 0, (op.__name__, backend)


def _eqns(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for v in e.params.values():
      inner = getattr(v, "jaxpr", v)
      if isinstance(inner, jax.extend.core.Jaxpr) and e.primitive.name != "pallas_call":
        yield from _eqns(inner)
