"""KDA: the family suite on the reduced shape matrix (its chunked path is the gated delta rule's,
with per-channel gates), extreme gates, one step by hand, bad inputs."""
import dataclasses
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.kda import chunk_kda, fused_recurrent_kda
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import KDA, kda_inputs, matrix_state


class TestXla(harness.FamilySuite):
  CASE = KDA
  SHAPES = harness.REDUCED_SHAPE_CASES


@pytest.mark.parametrize("gate_scale,gate_shift", [(0.01, 2.0), (10.0, 0.0)])
def test_extreme_per_channel_gates(gate_scale, gate_shift):
  """Per-channel log decays from ~-0.13 everywhere to log_sigmoid(10 z): channels near 0 next to
  channels at -10 to -30 per step, so chunk cumsums reach the hundreds (exp(-G) would overflow float32
  if the decays were not taken relative within sub-chunks)."""
  case = dataclasses.replace(KDA, make_inputs=lambda *a: kda_inputs(*a, gate_scale=gate_scale,
                                                                    gate_shift=gate_shift))
  harness.check_op(case, T=130, H=2, K=32, V=32, dtype="float32")


def test_per_channel_decay_definition():
  """One step by hand: S = diag(exp(g)) S0, then the delta-rule write."""
  rng = np.random.default_rng(3)
  x = kda_inputs(rng, 1, 1, 1, 4, 3)
  S0 = matrix_state(rng, 1, 1, 4, 3)
  q, k, v, g, b = (np.asarray(a, np.float64)[0, 0, 0] for a in x.values())
  S = np.exp(g)[:, None] * np.asarray(S0, np.float64)[0, 0]
  S = S + np.outer(k, b * (v - S.T @ k))
  o, S_out = jax.jit(lambda xs, S0: chunk_kda(*xs, initial_state=S0, output_final_state=True))(
      tuple(x.values()), S0)
  np.testing.assert_allclose(o[0, 0, 0], S.T @ (q / 2), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(S_out[0, 0], S, rtol=1e-5, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
  x = kda_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
  with pytest.raises(ValueError, match="`g` must have rank 4"):
    chunk_kda(x["q"], x["k"], x["v"], x["g"][..., 0], x["beta"])
  with pytest.raises(ValueError, match="`g` must have shape"):
    chunk_kda(x["q"], x["k"], x["v"], x["g"][..., :4], x["beta"])
  with pytest.raises(ValueError, match="log decays"):
    chunk_kda(x["q"], x["k"], x["v"], -x["g"], x["beta"])
  with pytest.raises(ValueError, match="`beta` must have shape"):
    chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"][:, :3])
  with pytest.raises(ValueError, match="`backend` must be one of"):
    chunk_kda(*x.values(), backend="cuda")
  with pytest.raises(ValueError, match="non-decreasing"):
    fused_recurrent_kda(*x.values(), cu_seqlens=jnp.array([0, 9, 5, 16], jnp.int32))
  with pytest.raises(ValueError, match="`initial_state` must have shape"):
    chunk_kda(*x.values(), initial_state=jnp.zeros((2, 2, 8, 8)))


def test_positive_gates_are_clamped_under_jit():
  x = kda_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
  run = jax.jit(lambda *a: chunk_kda(*a)[0])
  o, o0 = run(*dict(x, g=jnp.abs(x["g"])).values()), run(*dict(x, g=jnp.zeros_like(x["g"])).values())
  np.testing.assert_allclose(o, o0, rtol=1e-6, atol=1e-6)
