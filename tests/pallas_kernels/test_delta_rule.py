"""The delta rule: the family suite on the reduced shape matrix (its chunked path is the gated delta
rule's with the decay off), write strengths, bad inputs."""
import dataclasses
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import DELTA_RULE, delta_rule_inputs


class TestXla(harness.FamilySuite):
  CASE = DELTA_RULE
  SHAPES = harness.REDUCED_SHAPE_CASES


@pytest.mark.parametrize("beta_scale", [0.01, 10.0])
def test_extreme_write_strengths(beta_scale):
  """beta logits scaled from 0.01 (beta ~ 0.5) to 10 (beta saturating at 0 and 1: near-exact overwrites)."""
  case = dataclasses.replace(DELTA_RULE,
                             make_inputs=lambda *a: delta_rule_inputs(*a, beta_scale=beta_scale))
  harness.check_op(case, T=130, H=2, K=32, V=32, dtype="float32")


def test_bad_inputs_raise_clear_errors():
  x = delta_rule_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
  with pytest.raises(ValueError, match="`k` must have shape"):
    chunk_delta_rule(x["q"], x["k"][..., :4], x["v"], x["beta"])
  with pytest.raises(ValueError, match="`v` must have rank 4"):
    chunk_delta_rule(x["q"], x["k"], x["v"][..., 0], x["beta"])
  with pytest.raises(ValueError, match="`beta` must have shape"):
    chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"][:, :3])
  with pytest.raises(ValueError, match="`beta` must have rank 3"):
    chunk_delta_rule(x["q"], x["k"], x["v"], None)
  with pytest.raises(ValueError, match="`backend` must be one of"):
    chunk_delta_rule(*x.values(), backend="cuda")
  with pytest.raises(ValueError, match="must end at the packed length"):
    fused_recurrent_delta_rule(*x.values(), cu_seqlens=jnp.array([0, 5, 15], jnp.int32))
  two = delta_rule_inputs(np.random.default_rng(0), 2, 16, 2, 8, 8)
  with pytest.raises(ValueError, match="B == 1"):
    chunk_delta_rule(*two.values(), cu_seqlens=jnp.array([0, 16], jnp.int32))
  with pytest.raises(ValueError, match="`initial_state` must have shape"):
    chunk_delta_rule(*x.values(), initial_state=jnp.zeros((1, 2, 8, 4)))
