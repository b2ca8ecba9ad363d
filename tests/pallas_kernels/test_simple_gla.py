"""Simple GLA: the shared additive suite over three gate modes (g only, g_gamma only, both)."""
import functools

import numpy as np

from pallas_kernels.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
from tests.pallas_kernels import harness
from tests.pallas_kernels.test_gla import GatedSuite, log_decays, make_state, qkv


def make_inputs(rng, B, T, H, K, V, gate_scale=1.0, gates=("g", "g_gamma")):
  x = dict(qkv(rng, B, T, H, K, V), g=log_decays(rng, B, T, H, gate_scale=gate_scale),
           g_gamma=log_decays(rng, H, gate_scale=gate_scale, shift=3.0))
  return {n: a for n, a in x.items() if n in ("q", "k", "v") + gates}


def g_gamma_by_keyword(op):
  """The op with g_gamma as its 4th positional input (g left None)."""
  return lambda q, k, v, g_gamma, **kw: op(q, k, v, g_gamma=g_gamma, **kw)


BOTH = harness.OpCase("simple_gla", chunk_simple_gla, fused_recurrent_simple_gla, make_inputs,
                      make_state, gates=("g", "g_gamma"), static_inputs=("g_gamma",))
G_ONLY = harness.OpCase("simple_gla[g]", chunk_simple_gla, fused_recurrent_simple_gla,
                        functools.partial(make_inputs, gates=("g",)), make_state, gates=("g",))
GAMMA_ONLY = harness.OpCase("simple_gla[g_gamma]", g_gamma_by_keyword(chunk_simple_gla),
                            g_gamma_by_keyword(fused_recurrent_simple_gla),
                            functools.partial(make_inputs, gates=("g_gamma",)), make_state,
                            gates=("g_gamma",), static_inputs=("g_gamma",))


class TestSimpleGLA(GatedSuite):
  CASES = (BOTH, G_ONLY, GAMMA_ONLY)

  @staticmethod
  def float64(x):
    g = np.asarray(x["g"], np.float64)[..., None] + np.asarray(x["g_gamma"], np.float64)[:, None]
    return x["q"], x["k"], x["v"], g, None
