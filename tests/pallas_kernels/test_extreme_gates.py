"""Gates at the ends of their range, on the chunked xla path (the default on CPU) against the float32
reference: log decays of -inf (a decay of exactly 0: outputs, states and every gradient finite, the
gradient of a -inf gate 0) and of magnitude 1e4 (no precision lost to differences of large cumsums).
check_op fails on any NaN or inf (its relative errors are then NaN)."""
import dataclasses

import numpy as np
import jax.numpy as jnp
import pytest

from pallas_kernels import chunk_mlstm
from tests.pallas_kernels import cases, harness
from tests.pallas_kernels.test_float64 import mlstm64

# (case, the inputs that are log-decay gates)
GATED = [
    (cases.GLA, ("g",)),
    (cases.GDN, ("g",)),
    (cases.KDA, ("g",)),
    (cases.SIMPLE_GLA, ("g", "g_gamma")),
    (cases.SIMPLE_GLA_G_ONLY, ("g",)),
    (cases.SIMPLE_GLA_GAMMA_ONLY, ("g_gamma",)),
    (cases.RWKV6, ("w",)),
    (cases.HGRN, ("g",)),
]


def with_gates(case, gates, transform, label):
  """`case` whose gate inputs go through `transform(rng, gate) -> gate`."""
  def make_inputs(rng, *shape):
    x = case.make_inputs(rng, *shape)
    return dict(x, **{n: jnp.asarray(transform(rng, np.array(x[n])), jnp.float32) for n in gates})
  return dataclasses.replace(case, name=f"{case.name}[{label}]", make_inputs=make_inputs)


def zero_decays(rng, g):
  """About a fifth of the entries -inf; for per-step gates also every entry of one whole step
  (every head and channel), so a chunk holds several zero decays in a row."""
  g = np.where(rng.random(g.shape) < 0.2, -np.inf, g)
  if g.ndim >= 3:
    g[:, min(40, g.shape[1] - 1)] = -np.inf
  return g


def mlstm_zero_gates(case):
  """mLSTM with forget-gate pre-activations f = -inf (nothing kept) as `zero_decays` places them and
  input gates i = -inf (nothing written) at a fifth of the other steps. Not both at one step: then
  the stabilizer m of mlstm_kernels' recurrence becomes -inf and the recurrence is undefined."""
  def make_inputs(rng, *shape):
    x = case.make_inputs(rng, *shape)
    f = zero_decays(rng, np.array(x["f"]))
    i = np.where((rng.random(f.shape) < 0.2) & np.isfinite(f), -np.inf, np.array(x["i"]))
    return dict(x, i=jnp.asarray(i, jnp.float32), f=jnp.asarray(f, jnp.float32))
  return dataclasses.replace(case, name=f"{case.name}[-inf]", make_inputs=make_inputs)


def large_decays(rng, g):
  """Log decays of magnitude 1e-2 to 1e4 (log-uniform) in about half the entries."""
  big = -10.0 ** rng.uniform(-2, 4, g.shape)
  return np.where(rng.random(g.shape) < 0.5, big, g)


ids = lambda x: x.name if isinstance(x, harness.OpCase) else "-".join(x)


@pytest.mark.parametrize("case,gates", GATED, ids=ids)
def test_zero_decays_are_exact_and_finite(case, gates):
  zero = with_gates(case, gates, zero_decays, "-inf")
  harness.check_op(zero, T=130, H=2, K=16, V=16, dtype="float32")


def test_mlstm_zero_gates_are_exact_and_finite():
  harness.check_op(mlstm_zero_gates(cases.MLSTM), T=130, H=2, K=16, V=16, dtype="float32")


@pytest.mark.parametrize("case,gates", GATED[:1] + GATED[3:4] + GATED[6:7], ids=ids)
def test_zero_decays_bf16_varlen(case, gates):
  zero = with_gates(case, gates, zero_decays, "-inf")
  harness.check_op(zero, T=150, H=2, K=16, V=16, dtype="bfloat16", varlen=True)


@pytest.mark.parametrize("case,gates", GATED, ids=ids)
def test_large_decays_keep_float32_precision(case, gates):
  large = with_gates(case, gates, large_decays, "1e4")
  harness.check_op(large, T=130, H=2, K=16, V=16, dtype="float32")


@pytest.mark.parametrize("backend,kw", [("xla", {}), ("gpu", {"interpret": True})],
                         ids=["xla", "pallas_gpu_interpret"])
def test_mlstm_padding_gates_leave_the_state(backend, kw):
  """Tokens with input gate -1e30 and forget gate 1e30 (how lineax_lm pads a prompt to a compiled
  width, `layers.common.run_op`'s neutral) leave all three of mLSTM's states exactly as the prompt
  alone leaves them, from a prompt that ends inside a chunk."""
  rng = np.random.default_rng(0)
  B, T, H, K, n = 1, 128, 2, 16, 70
  q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, K)), jnp.float32) for _ in range(3))
  i, f = (jnp.asarray(rng.normal(size=(B, T, H)) + shift, jnp.float32) for shift in (0.0, 3.0))
  pad = (jnp.arange(T) >= n)[None, :, None]
  _, alone = chunk_mlstm(q[:, :n], k[:, :n], v[:, :n], i[:, :n], f[:, :n], output_final_state=True,
                         backend=backend, **kw)
  _, padded = chunk_mlstm(q, k, v, jnp.where(pad, -1e30, i), jnp.where(pad, 1e30, f),
                          output_final_state=True, backend=backend, **kw)
  for a, b in zip(alone, padded):
    np.testing.assert_array_equal(a, b)
