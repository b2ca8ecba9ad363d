"""GLA: the shared gated suite on the additive core the other additive families re-route to (full
shape matrix)."""
from tests.pallas_kernels import cases, harness


class TestGLA(harness.GatedSuite):
  CASES = (cases.GLA,)

  @staticmethod
  def float64(x):
    return x["q"], x["k"], x["v"], x["g"], None
