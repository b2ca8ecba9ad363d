"""The gated delta rule, the core the delta rule and KDA re-route to: the full shape matrix, varlen,
decode, extreme gates, an independent float64 forward and backward, bad inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pallas_kernels.gated_delta_rule import chunk_gated_delta_rule
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import GDN, gdn_inputs, matrix_state
from tests.pallas_kernels.harness import normal


@pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES)
def test_xla_matches_reference(T, H, K, V, dtype):
  harness.check_op(GDN, T=T, H=H, K=K, V=V, dtype=dtype)


@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_varlen_against_reference(dtype):
  harness.check_op(GDN, T=300, H=2, K=64, V=32, dtype=dtype, varlen=True)


def test_varlen_equals_per_sequence_loop():
  harness.check_varlen_matches_loop(GDN)


def test_chunk_then_fused_recurrent_decode():
  harness.check_decode_continuation(GDN)


@pytest.mark.parametrize("gate_scale", [0.01, 10.0])
def test_extreme_gates(gate_scale):
  case = harness.OpCase(GDN.name, GDN.chunk, GDN.fused_recurrent,
                        lambda *a: gdn_inputs(*a, gate_scale=gate_scale), matrix_state, gates=GDN.gates)
  harness.check_op(case, T=130, H=2, K=32, V=32, dtype="float32")


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(B=st.integers(1, 2), T=st.integers(1, 140), H=st.integers(1, 3), K=st.sampled_from([8, 16, 24]),
       V=st.integers(1, 20))
def test_property_shapes_and_agreement(B, T, H, K, V):
  inputs = gdn_inputs(np.random.default_rng(T * 7 + K), B, T, H, K, V)
  run = jax.jit(lambda xs, backend: chunk_gated_delta_rule(*xs, output_final_state=True, backend=backend),
                static_argnums=1)
  (o, S), (o_ref, S_ref) = run(tuple(inputs.values()), "xla"), run(tuple(inputs.values()), "reference")
  assert o.shape == (B, T, H, V) and S.shape == (B, H, K, V) and S.dtype == jnp.float32
  assert harness.rel_rms(o, o_ref) < 1e-4 and harness.rel_rms(S, S_ref) < 1e-4


# --- an independent float64 check: numpy forward and hand-written backward of the recurrence -----

def gdn_float64(q, k, v, g, beta, h0, do, dS, scale):
  """Forward and backward of the gated delta rule in float64 numpy, written from the recurrence."""
  q, k, v, g, beta, h0, do, dS = (np.asarray(x, np.float64) for x in (q, k, v, g, beta, h0, do, dS))
  B, T, H, K = q.shape
  S = h0.copy()
  S_prev, pred, outs = [], [], []
  for t in range(T):
    S_prev.append(S)
    Sd = S * np.exp(g[:, t])[..., None, None]
    p = np.einsum("bhkv,bhk->bhv", Sd, k[:, t])
    u = beta[:, t, :, None] * (v[:, t] - p)
    S = Sd + k[:, t, :, :, None] * u[..., None, :]
    pred.append(p)
    outs.append(np.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
  o, S_final = np.stack(outs, 1), S
  dq, dk, dv, dg, dbeta = (np.zeros_like(x) for x in (q, k, v, g, beta))
  dSt = dS.copy()
  for t in reversed(range(T)):
    a = np.exp(g[:, t])
    Sd = S_prev[t] * a[..., None, None]
    u = beta[:, t, :, None] * (v[:, t] - pred[t])
    St = Sd + k[:, t, :, :, None] * u[..., None, :]
    dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", St, do[:, t])
    dSt = dSt + scale * q[:, t, :, :, None] * do[:, t, :, None, :]
    dk[:, t] = np.einsum("bhkv,bhv->bhk", dSt, u)
    du = np.einsum("bhkv,bhk->bhv", dSt, k[:, t])
    dbeta[:, t] = np.sum(du * (v[:, t] - pred[t]), -1)
    dv[:, t] = beta[:, t, :, None] * du
    dp = -beta[:, t, :, None] * du
    dSd = dSt + k[:, t, :, :, None] * dp[..., None, :]
    dk[:, t] += np.einsum("bhkv,bhv->bhk", Sd, dp)
    dg[:, t] = np.sum(dSd * Sd, (-1, -2))
    dSt = a[..., None, None] * dSd
  return o, S_final, dict(q=dq, k=dk, v=dv, g=dg, beta=dbeta), dSt


def test_xla_matches_independent_float64_recurrence():
  B, T, H, K, V = 2, 150, 2, 32, 24
  rng = np.random.default_rng(2026)
  inputs = gdn_inputs(rng, B, T, H, K, V)
  h0 = matrix_state(rng, B, H, K, V)
  do, dS = normal(rng, B, T, H, V), normal(rng, B, H, K, V)
  o64, S64, g64, dh64 = gdn_float64(*inputs.values(), h0, do, dS, K ** -0.5)
  o, S, (g_in, dh0) = harness.run_op(GDN, chunk_gated_delta_rule, inputs, h0, (do, dS), None, backend="xla")
  errs = {"o": harness.rel_rms(o, o64), "S": harness.rel_rms(S, S64), "dh0": harness.rel_rms(dh0, dh64)}
  errs.update({f"d{n}": harness.rel_rms(g_in[n], g64[n]) for n in g64})
  assert all(e < 1e-4 for e in errs.values()), errs


# --- bad input -----------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
  x = gdn_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
  with pytest.raises(ValueError, match="`k` must have shape"):
    chunk_gated_delta_rule(x["q"], x["k"][..., :4], x["v"], x["g"], x["beta"])
  with pytest.raises(ValueError, match="`g` must have shape"):
    chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"][:, :3], x["beta"])
  with pytest.raises(ValueError, match="log decays"):
    chunk_gated_delta_rule(x["q"], x["k"], x["v"], -x["g"], x["beta"])
  with pytest.raises(ValueError, match="`backend` must be one of"):
    chunk_gated_delta_rule(*x.values(), backend="cuda")
  with pytest.raises(ValueError, match="must end at the packed length"):
    chunk_gated_delta_rule(*x.values(), cu_seqlens=jnp.array([0, 5, 15], jnp.int32))
  with pytest.raises(ValueError, match="non-decreasing"):
    chunk_gated_delta_rule(*x.values(), cu_seqlens=jnp.array([0, 9, 5, 16], jnp.int32))
  two = gdn_inputs(np.random.default_rng(0), 2, 16, 2, 8, 8)
  with pytest.raises(ValueError, match="B == 1"):
    chunk_gated_delta_rule(*two.values(), cu_seqlens=jnp.array([0, 16], jnp.int32))
  with pytest.raises(ValueError, match="`initial_state` must have shape"):
    chunk_gated_delta_rule(*x.values(), initial_state=jnp.zeros((2, 2, 8, 8)))


def test_positive_gates_are_clamped_under_jit():
  x = gdn_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
  pos = dict(x, g=jnp.abs(x["g"]))
  o = jax.jit(lambda *a: chunk_gated_delta_rule(*a)[0])(*pos.values())
  o0 = chunk_gated_delta_rule(*dict(x, g=jnp.zeros_like(x["g"])).values())[0]
  np.testing.assert_allclose(o, o0, rtol=1e-6, atol=1e-6)
