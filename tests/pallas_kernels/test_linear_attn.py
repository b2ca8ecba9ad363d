"""Linear attention: the shared additive suite, and fla's normalize=True against float64."""
import functools

import jax
import numpy as np
import pytest

from pallas_kernels.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
from tests.pallas_kernels import harness
from tests.pallas_kernels.harness import normal, sigmoid
from tests.pallas_kernels.test_gla import AdditiveSuite, make_state, qkv

CASE = harness.OpCase("linear_attn", chunk_linear_attn, fused_recurrent_linear_attn, qkv, make_state)


class TestLinearAttn(AdditiveSuite):
  CASES = (CASE,)

  @staticmethod
  def float64(x):
    return x["q"], x["k"], x["v"], 0.0, None


# --- normalize=True: positive feature maps, as the normalizer assumes ------------------------------

def positive_features(rng, B, T, H, K, V):
  return dict(q=sigmoid(normal(rng, B, T, H, K)), k=sigmoid(normal(rng, B, T, H, K)),
              v=normal(rng, B, T, H, V))


NORMALIZED = harness.OpCase("linear_attn[normalize]",
                            functools.partial(chunk_linear_attn, normalize=True),
                            functools.partial(fused_recurrent_linear_attn, normalize=True),
                            positive_features, make_state)


@pytest.mark.parametrize("T,H,K,V,dtype", [(130, 2, 32, 48, "float32"), (65, 3, 16, 16, "bfloat16")])
def test_normalize_xla_matches_reference(T, H, K, V, dtype):
  harness.check_op(NORMALIZED, T=T, H=H, K=K, V=V, dtype=dtype)


def test_normalize_restarts_at_sequence_boundaries():
  harness.check_varlen_matches_loop(NORMALIZED)


def test_normalize_matches_float64():
  """o_t = scale q_t^T (S_0 + sum_{s<=t} k_s v_s^T) / (scale q_t . sum_{s<=t} k_s + 1e-10)."""
  B, T, H, K, V = 2, 90, 2, 16, 24
  rng = np.random.default_rng(7)
  x = positive_features(rng, B, T, H, K, V)
  h0 = make_state(rng, B, H, K, V)
  q, k, v, S0 = (np.asarray(a, np.float64) for a in (*x.values(), h0))
  scale = K ** -0.5
  mask = np.tril(np.ones((T, T)))
  num = scale * (np.einsum("bthk,bhkv->bthv", q, S0)
                 + np.einsum("bthk,bshk,ts,bshv->bthv", q, k, mask, v, optimize=True))
  den = scale * np.einsum("bthk,bshk,ts->bth", q, k, mask, optimize=True)[..., None] + 1e-10
  for op in (chunk_linear_attn, fused_recurrent_linear_attn):
    o, _ = jax.jit(lambda x, h: op(*x, initial_state=h, normalize=True))(tuple(x.values()), h0)
    assert harness.rel_rms(o, num / den) < 1e-5
