"""Retention: the shared additive suite (simple GLA with the fixed decay log(1 - 2**(-5-h)))."""
import numpy as np

from pallas_kernels.retention import chunk_retention, fused_recurrent_retention
from tests.pallas_kernels import harness
from tests.pallas_kernels.test_gla import AdditiveSuite, make_state, qkv


class TestRetention(AdditiveSuite):
  CASES = (harness.OpCase("retention", chunk_retention, fused_recurrent_retention, qkv, make_state),)

  @staticmethod
  def float64(x):
    H = x["q"].shape[2]
    return x["q"], x["k"], x["v"], np.log(1.0 - 2.0 ** (-5.0 - np.arange(H)))[:, None], None
