"""common.chunk's gate sums: the dot form of the cumsum equals float64 sums, keeps -inf gates (a
decay of exactly 0) as sums whose exp is 0, and gives finite gradients (0 for the -inf gates)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.common.chunk import GATE_FLOOR, gate_cumsum, suffix_sum


@pytest.mark.parametrize("reverse", [False, True])
def test_gate_cumsum_equals_float64_sums(reverse):
  g = -np.abs(np.random.default_rng(0).standard_normal((3, 64, 5))) * np.array([1e-2, 1, 10, 1e3, 1e4])
  want = np.flip(np.cumsum(np.flip(g, 1), 1), 1) if reverse else np.cumsum(g, 1)
  got = np.asarray(gate_cumsum(jnp.asarray(g, jnp.float32), axis=1, reverse=reverse))
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_minus_inf_gates_give_zero_decays_and_finite_gradients():
  g = -np.abs(np.random.default_rng(1).standard_normal((16, 3))).astype(np.float32)
  g[5, 1] = -np.inf
  decays = lambda g: jnp.exp(suffix_sum(g, axis=0))
  d = np.asarray(decays(jnp.asarray(g)))
  assert np.all(d[:5, 1] == 0) and np.all(d[5:, 1] > 0) and np.all(d[:, [0, 2]] > 0)
  assert np.all(np.asarray(gate_cumsum(jnp.asarray(g), axis=0))[5:, 1] <= GATE_FLOOR)
  grad = np.asarray(jax.grad(lambda g: jnp.sum(decays(g)))(jnp.asarray(g)))
  assert np.all(np.isfinite(grad)) and grad[5, 1] == 0
