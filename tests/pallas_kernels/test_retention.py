"""Retention: the shared additive suite (simple GLA with the fixed decay log(1 - 2**(-5-h))) on the
reduced shape matrix: its chunked path is simple GLA's."""
import numpy as np

from tests.pallas_kernels import cases, harness


class TestRetention(harness.AdditiveSuite):
  CASES = (cases.RETENTION,)
  SHAPES = harness.REDUCED_SHAPE_CASES

  @staticmethod
  def float64(x):
    H = x["q"].shape[2]
    return x["q"], x["k"], x["v"], np.log(1.0 - 2.0 ** (-5.0 - np.arange(H)))[:, None], None
