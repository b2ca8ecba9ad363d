"""Simple GLA: the shared additive suite over three gate modes (g only, g_gamma only, both), on the
full shape matrix (retention and linear attention re-route to it)."""
import numpy as np

from tests.pallas_kernels import cases, harness


class TestSimpleGLA(harness.GatedSuite):
  CASES = (cases.SIMPLE_GLA, cases.SIMPLE_GLA_G_ONLY, cases.SIMPLE_GLA_GAMMA_ONLY)

  @staticmethod
  def float64(x):
    g = np.asarray(x["g"], np.float64)[..., None] + np.asarray(x["g_gamma"], np.float64)[:, None]
    return x["q"], x["k"], x["v"], g, None
