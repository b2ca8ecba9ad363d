"""Linear attention: the shared additive suite on the reduced shape matrix (its chunked path is
simple GLA's), and fla's normalize=True against float64."""
import jax
import numpy as np
import pytest

from pallas_kernels.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
from tests.pallas_kernels import cases, harness
from tests.pallas_kernels.cases import LINEAR_ATTN_NORMALIZED, matrix_state, positive_features


class TestLinearAttn(harness.AdditiveSuite):
  CASES = (cases.LINEAR_ATTN,)
  SHAPES = harness.REDUCED_SHAPE_CASES

  @staticmethod
  def float64(x):
    return x["q"], x["k"], x["v"], 0.0, None


# --- normalize=True: positive feature maps, as the normalizer assumes ------------------------------


@pytest.mark.parametrize("T,H,K,V,dtype", [(130, 2, 32, 48, "float32"), (65, 3, 16, 16, "bfloat16")])
def test_normalize_xla_matches_reference(T, H, K, V, dtype):
  harness.check_op(LINEAR_ATTN_NORMALIZED, T=T, H=H, K=K, V=V, dtype=dtype)


def test_normalize_restarts_at_sequence_boundaries():
  harness.check_varlen_matches_loop(LINEAR_ATTN_NORMALIZED)


def test_normalize_matches_float64():
  """o_t = scale q_t^T (S_0 + sum_{s<=t} k_s v_s^T) / (scale q_t . sum_{s<=t} k_s + 1e-10)."""
  B, T, H, K, V = 2, 90, 2, 16, 24
  rng = np.random.default_rng(7)
  x = positive_features(rng, B, T, H, K, V)
  h0 = matrix_state(rng, B, H, K, V)
  q, k, v, S0 = (np.asarray(a, np.float64) for a in (*x.values(), h0))
  scale = K ** -0.5
  mask = np.tril(np.ones((T, T)))
  num = scale * (np.einsum("bthk,bhkv->bthv", q, S0)
                 + np.einsum("bthk,bshk,ts,bshv->bthv", q, k, mask, v, optimize=True))
  den = scale * np.einsum("bthk,bshk,ts->bth", q, k, mask, optimize=True)[..., None] + 1e-10
  for op in (chunk_linear_attn, fused_recurrent_linear_attn):
    o, _ = jax.jit(lambda x, h: op(*x, initial_state=h, normalize=True))(tuple(x.values()), h0)
    assert harness.rel_rms(o, num / den) < 1e-5
