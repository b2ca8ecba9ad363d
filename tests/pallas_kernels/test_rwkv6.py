"""RWKV-6: the shared additive suite (o_t reads S_{t-1} plus the bonus u; u gets a gradient too) on
the reduced shape matrix: its chunked path is GLA's."""
from tests.pallas_kernels import cases, harness


class TestRWKV6(harness.GatedSuite):
  CASES = (cases.RWKV6,)
  SHAPES = harness.REDUCED_SHAPE_CASES

  @staticmethod
  def float64(x):
    return x["r"], x["k"], x["v"], x["w"], x["u"]
