"""The references' sequential pass: `checkpointed_scan` gives lax.scan's values and gradients
(any block length, a remainder or none) while its backward holds a fraction of the states."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_kernels.common.scan import checkpointed_scan


def _step(state, x):
  state = jnp.tanh(0.9 * state + x)
  return state, jnp.sum(state)


@pytest.mark.parametrize("T,block", [(1, None), (5, None), (100, None), (100, 7), (64, 64), (64, 1)])
def test_same_values_and_gradients_as_lax_scan(T, block):
  xs = jnp.asarray(np.random.default_rng(T).standard_normal((T, 8)), jnp.float32)

  def loss(xs, state0, scan):
    final, ys = scan(_step, state0, xs)
    return jnp.sum(final ** 2) + jnp.sum(ys)

  ours = lambda step, c, x: checkpointed_scan(step, c, x, block)
  want = jax.value_and_grad(loss, argnums=(0, 1))(xs, jnp.ones(8), lax.scan)
  got = jax.value_and_grad(loss, argnums=(0, 1))(xs, jnp.ones(8), ours)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_backward_holds_a_fraction_of_the_states(monkeypatch):
  """A [64, 64] state over 1,024 steps: the plain scan's gradient keeps every step's state (the
  threshold lowered so that this small case is blocked)."""
  from pallas_kernels.common import scan as scan_module
  monkeypatch.setattr(scan_module, "MAX_KEPT_CARRY_BYTES", 0)
  xs = jax.ShapeDtypeStruct((1024, 64), jnp.float32)

  def temp_bytes(scan):
    def loss(xs):
      step = lambda S, x: (jnp.tanh(S * x[None, :]), None)
      return jnp.sum(scan(step, jnp.ones((64, 64)), xs)[0])
    return jax.jit(jax.grad(loss)).lower(xs).compile().memory_analysis().temp_size_in_bytes

  assert temp_bytes(checkpointed_scan) < temp_bytes(lax.scan) / 4
