"""HGRN (elementwise on [B, T, D]): the family suite on the full shape matrix, extreme and bf16
gates, memory linear in the width, the definition by hand, bad inputs."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.hgrn import chunk_hgrn, fused_recurrent_hgrn
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import HGRN, hgrn_inputs, hgrn_state
from tests.pallas_kernels.harness import log_sigmoid, normal


class TestXla(harness.FamilySuite):
  CASE = HGRN


@pytest.mark.parametrize("gate_scale,gate_shift", [(0.01, 2.0), (10.0, 0.0), (10.0, -20.0)])
def test_extreme_gates(gate_scale, gate_shift):
  """Log gates from ~-0.13 everywhere to ~-20 per step (chunk cumsums near -1300: exp(-G) would
  overflow float32 if the chunked form divided by the decay)."""
  case = dataclasses.replace(HGRN, make_inputs=lambda *a: hgrn_inputs(*a, gate_scale=gate_scale,
                                                                     gate_shift=gate_shift))
  harness.check_op(case, T=130, H=2, K=1, V=16, dtype="float32")


def test_bf16_gates():
  """Gates in bfloat16 too (the reference sees the same rounded values, upcast)."""
  case = dataclasses.replace(HGRN, float_inputs=("x", "g"))
  harness.check_op(case, T=100, H=2, K=1, V=24, dtype="bfloat16")


def _largest_intermediate(jaxpr) -> int:
  """Elements of the largest array any equation of `jaxpr` (or of a sub-jaxpr) produces."""
  best = 0
  for eqn in jaxpr.eqns:
    best = max([best] + [math.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape")])
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          best = max(best, _largest_intermediate(sub))
  return best


def test_xla_memory_stays_linear_in_width():
  """At D = 2048 neither the forward nor the backward forms anything larger than a few [B, T, D]
  arrays (a [C, C, D] intra-chunk tensor would be 64x larger than the input)."""
  B, T, D = 1, 256, 2048
  rng = np.random.default_rng(0)
  x, g = normal(rng, B, T, D), log_sigmoid(normal(rng, B, T, D))
  loss = lambda x, g, h0: jnp.sum(chunk_hgrn(x, g, h0, output_final_state=True, backend="xla")[0] ** 2)
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, g, jnp.zeros((B, D)))
  assert _largest_intermediate(jaxpr.jaxpr) <= 2 * B * T * D


def test_definition_by_hand():
  rng = np.random.default_rng(4)
  x, g = hgrn_inputs(rng, 1, 3, 1, 1, 5).values()
  h0 = hgrn_state(rng, 1, 1, 1, 5)
  h, outs = np.asarray(h0, np.float64), []
  for t in range(3):
    h = np.exp(np.asarray(g[:, t], np.float64)) * h + np.asarray(x[:, t], np.float64)
    outs.append(h)
  o, S = chunk_hgrn(x, g, h0, output_final_state=True)
  np.testing.assert_allclose(o, np.stack(outs, 1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(S, h, rtol=1e-5, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
  x, g = hgrn_inputs(np.random.default_rng(0), 1, 16, 2, 1, 4).values()
  with pytest.raises(ValueError, match="`x` must have rank 3"):
    chunk_hgrn(x[..., None], g)
  with pytest.raises(ValueError, match="`g` must have shape"):
    chunk_hgrn(x, g[:, :3])
  with pytest.raises(ValueError, match="`x` must be a floating-point array"):
    chunk_hgrn(x.astype(jnp.int32), g)
  with pytest.raises(ValueError, match="log decays"):
    fused_recurrent_hgrn(x, -g)
  with pytest.raises(ValueError, match="`backend` must be one of"):
    chunk_hgrn(x, g, backend="cuda")
  with pytest.raises(ValueError, match="must end at the packed length"):
    chunk_hgrn(x, g, cu_seqlens=jnp.array([0, 5, 15], jnp.int32))
  with pytest.raises(ValueError, match="`initial_state` must have shape"):
    chunk_hgrn(x, g, initial_state=jnp.zeros((2, 8)))


def test_positive_gates_are_clamped_under_jit():
  x, g = hgrn_inputs(np.random.default_rng(0), 1, 16, 2, 1, 4).values()
  run = jax.jit(lambda x, g: chunk_hgrn(x, g)[0])
  np.testing.assert_allclose(run(x, jnp.abs(g)), run(x, jnp.zeros_like(g)), rtol=1e-6, atol=1e-6)
