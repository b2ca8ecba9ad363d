"""GLA tests, and the suite every additive family (linear_attn, retention, simple_gla, gla, rwkv6)
shares: a family's test file subclasses `AdditiveSuite` (or `GatedSuite` when it has gate inputs)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gla import chunk_gla, fused_recurrent_gla
from tests.pallas_kernels import harness
from tests.pallas_kernels.harness import log_sigmoid, normal


# --- input makers the additive families share ----------------------------------------------------

def qkv(rng, B, T, H, K, V, names=("q", "k", "v")):
  return dict(zip(names, (normal(rng, B, T, H, K), normal(rng, B, T, H, K), normal(rng, B, T, H, V))))


def log_decays(rng, *shape, gate_scale=1.0, shift=2.0):
  """log_sigmoid of N(shift, gate_scale^2) logits: log decays <= 0 (down to about -30 at scale 10)."""
  return log_sigmoid(normal(rng, *shape, scale=gate_scale, shift=shift))


def make_state(rng, N, H, K, V):
  return normal(rng, N, H, K, V, scale=0.5)


def recurrence_float64(q, k, v, g, u, h0, scale):
  """The additive recurrence in float64 numpy, written from DESIGN.md. g broadcasts to [B, T, H, K]
  (log decays); u None or [H, K] (RWKV-6: o_t reads S_{t-1} plus the bonus). Returns (o, S)."""
  q, k, v, h0 = (np.asarray(x, np.float64) for x in (q, k, v, h0))
  g = np.broadcast_to(np.asarray(g, np.float64), q.shape)
  S, outs = h0, []
  for t in range(q.shape[1]):
    kv = k[:, t, :, :, None] * v[:, t, :, None, :]
    S_next = S * np.exp(g[:, t])[..., None] + kv
    read = S_next if u is None else S + np.asarray(u, np.float64)[..., None] * kv
    outs.append(np.einsum("bhkv,bhk->bhv", read, scale * q[:, t]))
    S = S_next
  return np.stack(outs, 1), S


# --- the shared suite ----------------------------------------------------------------------------

class AdditiveSuite(harness.FamilySuite):
  """harness.FamilySuite with several cases: subclasses set CASES (harness.OpCase objects; the shape
  matrix and the varlen test cycle through them, the other tests use CASE = CASES[0]) and
  `float64(inputs) -> (q, k, v, g, u)`, the recurrence_float64 arguments of CASE's inputs."""
  CASES: tuple = ()
  CASE = property(lambda self: self.CASES[0])

  @staticmethod
  def float64(inputs):
    raise NotImplementedError

  @pytest.mark.parametrize("i,T,H,K,V,dtype", [(i, *c) for i, c in enumerate(harness.SHAPE_CASES)])
  def test_xla_matches_reference(self, i, T, H, K, V, dtype):
    harness.check_op(self.CASES[i % len(self.CASES)], T=T, H=H, K=K, V=V, dtype=dtype)

  @pytest.mark.parametrize("i,dtype", list(enumerate(harness.DTYPES)))
  def test_varlen_against_reference(self, i, dtype):
    harness.check_op(self.CASES[i % len(self.CASES)], T=300, H=2, K=64, V=32, dtype=dtype,
                     varlen=True)

  def test_reference_matches_independent_float64_recurrence(self):
    B, T, H, K, V = 2, 150, 2, 32, 24
    rng = np.random.default_rng(2026)
    case = self.CASE
    inputs = case.make_inputs(rng, B, T, H, K, V)
    h0 = make_state(rng, B, H, K, V)
    o64, S64 = recurrence_float64(*self.float64(inputs), h0, K ** -0.5)
    # The reference is the definition the other tests hold every backend to: check it independently.
    o, S = jax.jit(lambda xs, h: case.chunk(*xs, initial_state=h, output_final_state=True,
                                             backend="reference"))(tuple(inputs.values()), h0)
    errs = (harness.rel_rms(o, o64), harness.rel_rms(S, S64))
    assert max(errs) < 1e-5, errs

  def test_bad_inputs_raise_clear_errors(self):
    case = self.CASE
    x = case.make_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
    first, *others = x
    with pytest.raises(ValueError, match=f"`{first}` must have rank 4"):
      case.chunk(*dict(x, **{first: x[first][0]}).values())
    for name in others:  # drop one head (or key channel) from one input: the error names it
      bad = jnp.delete(x[name], 0, axis=min(x[name].ndim - 1, 2))
      with pytest.raises(ValueError, match=f"`{name}` must have shape"):
        case.chunk(*dict(x, **{name: bad}).values())
    with pytest.raises(ValueError, match="`backend` must be one of"):
      case.chunk(*x.values(), backend="cuda")
    with pytest.raises(ValueError, match="must end at the packed length"):
      case.chunk(*x.values(), cu_seqlens=jnp.array([0, 5, 15], jnp.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
      case.chunk(*x.values(), cu_seqlens=jnp.array([0, 9, 5, 16], jnp.int32))
    two = case.make_inputs(np.random.default_rng(0), 2, 16, 2, 8, 8)
    with pytest.raises(ValueError, match="B == 1"):
      case.chunk(*two.values(), cu_seqlens=jnp.array([0, 16], jnp.int32))
    with pytest.raises(ValueError, match="`initial_state` must have shape"):
      case.chunk(*x.values(), initial_state=jnp.zeros((2, 2, 8, 8)))


class GatedSuite(AdditiveSuite):
  """AdditiveSuite plus the tests of families with log-decay gate inputs (CASE.gates; its
  `make_inputs` takes a `gate_scale` keyword)."""

  @pytest.mark.parametrize("gate_scale", [0.01, 10.0])
  def test_extreme_gates(self, gate_scale):
    case = self.CASE
    case = dataclasses.replace(case, make_inputs=functools.partial(case.make_inputs,
                                                                   gate_scale=gate_scale))
    harness.check_op(case, T=130, H=2, K=32, V=32, dtype="float32")

  def test_positive_gates_raise(self):
    case = self.CASE
    x = case.make_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
    for name in case.gates:
      with pytest.raises(ValueError, match=f"`{name}` holds natural-log decays"):
        case.chunk(*dict(x, **{name: jnp.abs(x[name]) + 0.5}).values())

  def test_positive_gates_are_clamped_under_jit(self):
    case = self.CASE
    x = case.make_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
    run = jax.jit(lambda xs: case.chunk(*xs)[0])
    o = run(tuple((jnp.abs(a) if n in case.gates else a) for n, a in x.items()))
    o0 = run(tuple((jnp.zeros_like(a) if n in case.gates else a) for n, a in x.items()))
    np.testing.assert_allclose(o, o0, rtol=1e-6, atol=1e-6)


# --- GLA -----------------------------------------------------------------------------------------

def make_inputs(rng, B, T, H, K, V, gate_scale=1.0):
  return dict(qkv(rng, B, T, H, K, V), g=log_decays(rng, B, T, H, K, gate_scale=gate_scale))


class TestGLA(GatedSuite):
  CASES = (harness.OpCase("gla", chunk_gla, fused_recurrent_gla, make_inputs, make_state,
                          gates=("g",)),)

  @staticmethod
  def float64(x):
    return x["q"], x["k"], x["v"], x["g"], None
