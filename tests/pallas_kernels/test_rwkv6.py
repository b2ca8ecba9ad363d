"""RWKV-6: the shared additive suite (o_t reads S_{t-1} plus the bonus u; u gets a gradient too)."""
from pallas_kernels.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
from tests.pallas_kernels import harness
from tests.pallas_kernels.harness import normal
from tests.pallas_kernels.test_gla import GatedSuite, log_decays, make_state, qkv


def make_inputs(rng, B, T, H, K, V, gate_scale=1.0):
  return dict(qkv(rng, B, T, H, K, V, names=("r", "k", "v")),
              w=log_decays(rng, B, T, H, K, gate_scale=gate_scale), u=normal(rng, H, K, scale=0.5))


class TestRWKV6(GatedSuite):
  CASES = (harness.OpCase("rwkv6", chunk_rwkv6, fused_recurrent_rwkv6, make_inputs, make_state,
                          gates=("w",), static_inputs=("u",)),)

  @staticmethod
  def float64(x):
    return x["r"], x["k"], x["v"], x["w"], x["u"]
