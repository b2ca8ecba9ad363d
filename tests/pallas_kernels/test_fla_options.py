"""fla 0.6.0's options on every backend: each against its definition (float64 recurrences, or the op
on inputs transformed by hand in numpy), then through the harness (xla against the float32
reference here; the GPU and TPU kernels in interpret mode, `slow`). Also fla's defaults, **kwargs,
the errors for options a backend cannot honour, and the (o, final_state) return of every op."""
import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from pallas_kernels.delta_rule import fused_recurrent_delta_rule
from pallas_kernels.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from pallas_kernels.gla import chunk_gla, fused_recurrent_gla
from pallas_kernels.kda import chunk_kda, fused_recurrent_kda
from pallas_kernels.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
from pallas_kernels.retention import fused_recurrent_retention
from pallas_kernels.rwkv6 import fused_recurrent_rwkv6
from pallas_kernels.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
from tests.pallas_kernels import cases, harness
from tests.pallas_kernels.cases import (GDN_FLA_LAYER, KDA_FLA_LAYER, KDA_LOWER_BOUND, GLA_FLA_LAYER,
                                        matrix_state, with_options)

B, T, H, K, V = 2, 40, 2, 16, 8
F64 = np.float64


def rng_of(*parts):
  return np.random.default_rng(harness.seed_of("fla-options", *parts))


def f64(*xs):
  return tuple(np.asarray(x, F64) for x in xs)


def delta64(q, k, v, beta, h0, scale, g=0.0, gk=0.0, gv=0.0):
  """The gated delta rule in float64 with fla's three decays, S = exp(g) diag(exp(gk)) S diag(exp(gv)),
  and beta [B, T, H] or [B, T, H, V]."""
  q, k, v, beta, S = f64(q, k, v, beta, h0)
  g, gk, gv = (np.broadcast_to(np.asarray(x, F64), shape) for x, shape in
               ((g, q.shape[:3]), (gk, q.shape), (gv, v.shape)))
  outs = []
  for t in range(q.shape[1]):
    S = (S * np.exp(g[:, t])[..., None, None] * np.exp(gk[:, t])[..., :, None]
         * np.exp(gv[:, t])[..., None, :])
    b = beta[:, t] if beta.ndim == 4 else beta[:, t, :, None]  # per value channel, or per head
    u = b * (v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t]))
    S = S + k[:, t, :, :, None] * u[:, :, None, :]
    outs.append(np.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
  return np.stack(outs, 1), S


# --- reverse: every sequence read from its last token ------------------------------------------

# (fused_recurrent op, its inputs, recurrence_float64's (g, u) of them)
REVERSIBLE = {
    "gla": (fused_recurrent_gla, cases.gla_inputs, lambda x: (x["g"], None)),
    "simple_gla": (fused_recurrent_simple_gla, cases.simple_gla_inputs,
                   lambda x: ((x["g"] + x["g_gamma"])[..., None], None)),
    "rwkv6": (fused_recurrent_rwkv6, cases.rwkv6_inputs, lambda x: (x["w"], x["u"])),
    "retention": (fused_recurrent_retention, cases.qkv,
                  lambda x: (np.log(1 - 2.0 ** (-5.0 - np.arange(H)))[:, None], None)),
    "linear_attn": (fused_recurrent_linear_attn, cases.qkv, lambda x: (0.0, None)),
}


@pytest.mark.parametrize("family", REVERSIBLE)
def test_reverse_runs_each_packed_sequence_backwards(family):
  op, make_inputs, gates = REVERSIBLE[family]
  rng = rng_of("reverse", family)
  x = make_inputs(rng, 1, T, H, K, V)
  cu = jnp.asarray([0, 9, 9, 30, T], jnp.int32)
  h0 = matrix_state(rng, 4, H, K, V)
  o, S = jax.jit(lambda x, h: op(*x, initial_state=h, output_final_state=True, reverse=True,
                                 cu_seqlens=cu))(tuple(x.values()), h0)
  g, u = gates(x)
  for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
    if a == b:  # the empty sequence keeps its state
      np.testing.assert_array_equal(S[n], h0[n])
      continue
    backwards = lambda y: np.asarray(y, F64)[:, a:b][:, ::-1]
    g_n = g if np.ndim(g) < 3 else backwards(g)
    o64, S64 = harness.recurrence_float64(*(backwards(x[m]) for m in list(x)[:3]), g_n, u,
                                          h0[n:n + 1], K ** -0.5)
    assert harness.rel_rms(o[:, a:b], o64[:, ::-1]) < 1e-5
    assert harness.rel_rms(S[n:n + 1], S64) < 1e-5


def test_reverse_normalizes_with_the_keys_that_follow():
  """fla's reverse normalizer: z_t = z_0 + sum_{s >= t} k_s; its final z is the sum over all."""
  rng = rng_of("reverse-normalize")
  x = cases.positive_features(rng, B, T, H, K, V)
  S0, z0 = cases.normalizer_state(rng, B, H, K, V)
  o, (S, z) = fused_recurrent_linear_attn(*x.values(), initial_state=(S0, z0), output_final_state=True,
                                          reverse=True, normalize=True)
  q, k, v = f64(*x.values())
  o64, S64 = harness.recurrence_float64(q[:, ::-1], k[:, ::-1], v[:, ::-1], 0.0, None, S0, K ** -0.5)
  z64 = np.asarray(z0, F64) + np.cumsum(k[:, ::-1], axis=1)
  den = np.sum(K ** -0.5 * q[:, ::-1] * z64, -1, keepdims=True) + 1e-10
  assert harness.rel_rms(o, (o64 / den)[:, ::-1]) < 1e-5
  assert harness.rel_rms(S, S64) < 1e-5 and harness.rel_rms(z, z64[:, -1:]) < 1e-5


REVERSED = [with_options(c, "reverse", chunk=c.chunk, reverse=True)
            for c in (cases.SIMPLE_GLA, cases.RWKV6, cases.LINEAR_ATTN_NORMALIZED)]


@pytest.mark.slow
@pytest.mark.parametrize("case", REVERSED, ids=lambda c: c.name)
def test_reverse_gpu_decode_kernels_interpret(case):
  harness.check_op(case, kind="fused_recurrent", T=30, H=2, K=16, V=16, dtype="float32", varlen=True,
                   backend="gpu", interpret=True)


def test_reverse_with_context_axis_raises():
  x = cases.qkv(rng_of("reverse-cp"), 1, 8, 1, 4, 4)
  with pytest.raises(ValueError, match="`reverse=True` cannot be combined with `context_axis`"):
    jax.vmap(lambda q: fused_recurrent_simple_gla(q[None], x["k"], x["v"], reverse=True,
                                                  context_axis="i")[0], axis_name="i")(x["q"])


# --- state_v_first: the state as [N, H, V, K] ----------------------------------------------------

# (op, its positional inputs) of every op with state_v_first
V_FIRST = {
    "chunk_gla": (chunk_gla, cases.gla_inputs),
    "fused_recurrent_gla": (fused_recurrent_gla, cases.gla_inputs),
    "chunk_simple_gla": (chunk_simple_gla, cases.simple_gla_inputs),
    "fused_recurrent_simple_gla": (fused_recurrent_simple_gla, cases.simple_gla_inputs),
    "fused_recurrent_retention": (fused_recurrent_retention, cases.qkv),
    "chunk_gated_delta_rule": (chunk_gated_delta_rule, cases.gdn_inputs),
    "fused_recurrent_gated_delta_rule": (cases.beta_by_keyword(fused_recurrent_gated_delta_rule),
                                         cases.gdn_inputs),
    "chunk_kda": (chunk_kda, cases.kda_inputs),
    "fused_recurrent_kda": (fused_recurrent_kda, cases.kda_inputs),
}


@pytest.mark.parametrize("name", V_FIRST)
def test_state_v_first_transposes_the_state(name):
  op, make_inputs = V_FIRST[name]
  rng = rng_of("v-first", name)
  x = tuple(make_inputs(rng, B, 20, H, K, V).values())
  h0 = matrix_state(rng, B, H, K, V)
  o, S = op(*x, initial_state=h0, output_final_state=True)
  o_t, S_t = op(*x, initial_state=jnp.swapaxes(h0, -1, -2), output_final_state=True, state_v_first=True)
  np.testing.assert_allclose(o_t, o, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(S_t, jnp.swapaxes(S, -1, -2), rtol=1e-6, atol=1e-6)
  if name.startswith("fused_recurrent") or name == "chunk_gated_delta_rule" or name == "chunk_kda":
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
      _, S_old = op(*x, initial_state=jnp.swapaxes(h0, -1, -2), output_final_state=True,
                    transpose_state_layout=True)
    np.testing.assert_array_equal(S_old, S_t)


def test_state_v_first_checks_the_v_first_layout():
  x = cases.gla_inputs(rng_of("v-first-check"), 1, 8, 2, 4, 6)
  with pytest.raises(ValueError, match=r"`initial_state` must have shape \[N, H, V, K\]"):
    chunk_gla(*x.values(), initial_state=jnp.zeros((1, 2, 4, 6)), state_v_first=True)


# --- fla's layer calls: gate and beta activations in the op, the V-first state ------------------

def by_hand(x, per_channel, lower_bound=None):
  """The fla layer's op inputs computed in numpy: l2-normalised q, k, the decay from the raw gate
  (fla's naive_gdn_gate / naive_kda_gate / naive_kda_lowerbound_gate), beta = 2 sigmoid(logits)."""
  q, k, v, g, beta, A_log, dt_bias = f64(*x.values())
  unit = lambda y: y / np.sqrt(np.sum(y * y, -1, keepdims=True) + 1e-6)
  bias = dt_bias.reshape(H, K) if per_channel else dt_bias
  A = np.exp(A_log)[:, None] if per_channel else np.exp(A_log)
  if lower_bound is None:
    gate = -A * np.logaddexp(0.0, g + bias)
  else:
    gate = lower_bound / (1 + np.exp(-A * (g + bias)))
  return unit(q), unit(k), v, gate, 2 / (1 + np.exp(-beta))


@pytest.mark.parametrize("case,lower_bound", [(GDN_FLA_LAYER, None), (KDA_FLA_LAYER, None),
                                              (KDA_LOWER_BOUND, -5.0)], ids=lambda c: getattr(c, "name", None))
def test_fla_layer_call_equals_its_inputs_computed_by_hand(case, lower_bound):
  per_channel = case is not GDN_FLA_LAYER
  rng = rng_of("by-hand", case.name)
  x = case.make_inputs(rng, B, T, H, K, V)
  h0 = matrix_state(rng, B, H, K, V)
  q, k, v, g, beta = by_hand(x, per_channel, lower_bound)
  gk = g if per_channel else 0.0
  o64, S64 = delta64(q, k, v, beta, h0, K ** -0.5, g=0.0 if per_channel else g, gk=gk)
  for op in (case.chunk, case.fused_recurrent):
    o, S = jax.jit(lambda x, h: op(*x, initial_state=h, output_final_state=True))(
        tuple(x.values()), jnp.swapaxes(h0, -1, -2))
    assert harness.rel_rms(o, o64) < 1e-5 and harness.rel_rms(jnp.swapaxes(S, -1, -2), S64) < 1e-5


FLA_LAYER_CASES = [GDN_FLA_LAYER, KDA_FLA_LAYER, KDA_LOWER_BOUND, GLA_FLA_LAYER]


# float32 varlen for every call, bf16 for each family. The lower-bound gate differs from KDA's
# other call only in its float32 gate formula; its decays near 1 (exp(-5 sigmoid(.)) with fla's
# dt_bias init) keep the whole bf16 rounding of the in-op l2norm in the state, past the 5e-3 bound.
@pytest.mark.parametrize("case,dtype,varlen", [(c, "float32", True) for c in FLA_LAYER_CASES] + [
    (c, "bfloat16", False) for c in (GDN_FLA_LAYER, KDA_FLA_LAYER, GLA_FLA_LAYER)],
    ids=lambda x: getattr(x, "name", x))
def test_fla_layer_call_xla_matches_reference(case, dtype, varlen):
  harness.check_op(case, T=70, H=2, K=16, V=32, dtype=dtype, varlen=varlen)


@pytest.mark.parametrize("case", FLA_LAYER_CASES, ids=lambda c: c.name)
def test_fla_layer_call_decode_continues_the_chunk_op(case):
  harness.check_decode_continuation(case, T=40, split=30, K=16, V=16)


# Every option is applied in front of the backend (the gates, l2norm and beta in each family's
# _run, state_v_first in common/api.run), so a Pallas backend sees the family's usual inputs, in the
# ranges the options give (beta up to 2, decays from the raw gate). Each backend runs the delta-rule
# kernels on them; on TPU, where KDA and the gated delta rule share one kernel, the gated delta rule
# alone: test_tpu_kernels runs that kernel with KDA's per-channel gates (steep ones too) and GLA's
# kernel, and state_v_first is the same swap on every backend (checked on xla above).
@pytest.mark.slow
@pytest.mark.parametrize("case,kind,backend", [
    (GDN_FLA_LAYER, "chunk", "gpu"), (GDN_FLA_LAYER, "fused_recurrent", "gpu"),
    (KDA_LOWER_BOUND, "chunk", "gpu"), (GLA_FLA_LAYER, "fused_recurrent", "gpu"),
    (GDN_FLA_LAYER, "chunk", "tpu")],
    ids=lambda x: getattr(x, "name", f"backend={x}" if x in ("gpu", "tpu") else x))
def test_fla_layer_call_pallas_kernels_interpret(case, kind, backend):
  harness.check_op(case, kind=kind, T=65, H=2, K=16, V=16, dtype="float32", varlen=True,
                   backend=backend, interpret=True)


def test_gate_and_beta_option_errors_name_the_option():
  x = cases.raw_gate_inputs(rng_of("errors"), 1, 8, 2, 4, 4, per_channel=True)
  q, k, v, g, beta, A_log, dt_bias = x.values()
  with pytest.raises(ValueError, match="`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel"):
    chunk_kda(q, k, v, -jnp.abs(g), beta, allow_neg_eigval=True)
  with pytest.raises(ValueError, match="`A_log` must be provided"):
    fused_recurrent_kda(q, k, v, g, beta, use_gate_in_kernel=True)
  with pytest.raises(ValueError, match="`lower_bound` must be in the safe range"):
    chunk_kda(q, k, v, g, beta, A_log=A_log, use_gate_in_kernel=True, safe_gate=True, lower_bound=-8.0)
  with pytest.raises(ValueError, match="`lower_bound` must be < 0"):
    fused_recurrent_kda(q, k, v, g, beta, use_gate_in_kernel=True, lower_bound=1.0)
  with pytest.raises(ValueError, match=r"`dt_bias` must have shape \[H \* K\]"):
    fused_recurrent_kda(q, k, v, g, beta, A_log, dt_bias[:4], use_gate_in_kernel=True)
  with pytest.raises(ValueError, match="return_intermediate_states"):
    chunk_kda(q, k, v, -jnp.abs(g), beta, return_intermediate_states=True)
  with pytest.raises(ValueError, match="`cp_context`"):
    chunk_gated_delta_rule(q, k, v, -jnp.abs(g[..., 0]), beta, cp_context=object())
  with pytest.raises(ValueError, match=r"`g` \(raw pre-activation\) must be provided"):
    fused_recurrent_gated_delta_rule(q, k, v, beta=beta, use_gate_in_kernel=True, A_log=A_log)


# --- grouped value heads (GVA): v with a multiple of q's and k's heads --------------------------

def grouped(case):
  """`case` with q and k of H / 2 heads: value heads 2h and 2h + 1 read q, k head h."""
  def make_inputs(rng, B, T, H, K, V):
    x = case.make_inputs(rng, B, T, H, K, V)
    return dict(x, q=x["q"][:, :, ::2], k=x["k"][:, :, ::2])
  return dataclasses.replace(case, name=case.name + "[gva]", make_inputs=make_inputs)


GVA_CASES = [grouped(cases.GDN), grouped(cases.KDA)]


@pytest.mark.parametrize("case", GVA_CASES, ids=lambda c: c.name)
def test_grouped_value_heads_match_float64_and_the_reference(case):
  rng = rng_of("gva", case.name)
  x = case.make_inputs(rng, B, T, 4, K, V)
  h0 = matrix_state(rng, B, 4, K, V)
  q, k = (np.repeat(np.asarray(x[n], F64), 2, axis=2) for n in ("q", "k"))
  per_channel = x["g"].ndim == 4
  o64, S64 = delta64(q, k, x["v"], x["beta"], h0, K ** -0.5, g=0.0 if per_channel else x["g"],
                     gk=x["g"] if per_channel else 0.0)
  for op in (case.chunk, case.fused_recurrent):
    o, S = op(*x.values(), initial_state=h0, output_final_state=True)
    assert harness.rel_rms(o, o64) < 1e-5 and harness.rel_rms(S, S64) < 1e-5
  harness.check_op(case, T=70, H=4, K=16, V=16, dtype="float32", varlen=True)


def test_value_heads_not_a_multiple_of_the_key_heads_raise():
  x = cases.gdn_inputs(rng_of("gva-bad"), 1, 8, 3, 4, 4)
  with pytest.raises(ValueError, match="`v` has 3 heads, not a multiple of the 2 heads"):
    chunk_gated_delta_rule(x["q"][:, :, :2], x["k"][:, :, :2], *list(x.values())[2:])


# --- per-channel gates of the decode ops: gk, gv ------------------------------------------------

def test_gated_delta_rule_decode_with_gk_and_gv_matches_float64():
  rng = rng_of("gk-gv")
  x = cases.gdn_inputs(rng, B, T, H, K, V)
  gk, gv = cases.log_decays(rng, B, T, H, K), cases.log_decays(rng, B, T, H, V)
  h0 = matrix_state(rng, B, H, K, V)
  for extra in ({"gk": gk}, {"gk": gk, "gv": gv}, {"gv": gv}):
    o, S = fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], beta=x["beta"],
                                            initial_state=h0, output_final_state=True, **extra)
    o64, S64 = delta64(x["q"], x["k"], x["v"], x["beta"], h0, K ** -0.5, g=x["g"],
                       gk=extra.get("gk", 0.0), gv=extra.get("gv", 0.0))
    assert harness.rel_rms(o, o64) < 1e-5 and harness.rel_rms(S, S64) < 1e-5, list(extra)


def test_gla_decode_with_gv_matches_float64():
  rng = rng_of("gla-gv")
  x = cases.gla_inputs(rng, B, T, H, K, V)
  gv = cases.log_decays(rng, B, T, H, V)
  h0 = matrix_state(rng, B, H, K, V)
  o, S = fused_recurrent_gla(*x.values(), gv=gv, initial_state=h0, output_final_state=True)
  q, k, v, g, gv64, S64 = f64(*x.values(), gv, h0)
  outs = []
  for t in range(T):
    S64 = S64 * np.exp(g[:, t])[..., :, None] * np.exp(gv64[:, t])[..., None, :] + (
        k[:, t, :, :, None] * v[:, t, :, None, :])
    outs.append(np.einsum("bhkv,bhk->bhv", S64, K ** -0.5 * q[:, t]))
  assert harness.rel_rms(o, np.stack(outs, 1)) < 1e-5 and harness.rel_rms(S, S64) < 1e-5


def test_decode_with_a_beta_per_value_channel_matches_float64():
  rng = rng_of("beta-per-channel")
  x = cases.kda_inputs(rng, B, T, H, K, V)
  beta = cases.sigmoid(harness.normal(rng, B, T, H, V))
  h0 = matrix_state(rng, B, H, K, V)
  o64, S64 = delta64(x["q"], x["k"], x["v"], beta, h0, K ** -0.5, gk=x["g"])
  for o, S in (fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], beta, initial_state=h0,
                                   output_final_state=True),
               fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], gk=x["g"], beta=beta,
                                                initial_state=h0, output_final_state=True)):
    assert harness.rel_rms(o, o64) < 1e-5 and harness.rel_rms(S, S64) < 1e-5
  with pytest.raises(ValueError, match=r"`beta \[B, T, H, V\]` is not supported by backend='gpu'"):
    fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], beta, backend="gpu")
  with pytest.raises(ValueError, match="`beta` must have rank 3"):
    chunk_kda(x["q"], x["k"], x["v"], x["g"], beta)


@pytest.mark.parametrize("backend", ["gpu", "tpu"], ids=["backend=gpu", "backend=tpu"])
def test_gv_on_a_pallas_backend_raises_naming_it(backend):
  x = cases.gla_inputs(rng_of("gv-raises"), 1, 8, 1, 4, 4)
  gv = -jnp.ones((1, 8, 1, 4))
  with pytest.raises(ValueError, match=f"`gv` is not supported by backend='{backend}'"):
    fused_recurrent_gla(*x.values(), gv=gv, backend=backend)
  with pytest.raises(ValueError, match=f"`gv` is not supported by backend='{backend}'"):
    fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], gv=gv, backend=backend)


def test_gla_decode_without_gates_is_linear_attention():
  x = cases.qkv(rng_of("gla-none"), B, T, H, K, V)
  np.testing.assert_allclose(fused_recurrent_gla(*x.values())[0],
                             fused_recurrent_linear_attn(*x.values())[0], rtol=1e-6, atol=1e-6)


# --- fla's defaults --------------------------------------------------------------------------

def test_decode_defaults_are_flas():
  """fused_recurrent_delta_rule: beta = 1; fused_recurrent_gated_delta_rule: no decay, beta = 1."""
  x = cases.qkv(rng_of("defaults"), B, T, H, K, V)
  ones = jnp.ones((B, T, H))
  want, _ = fused_recurrent_delta_rule(*x.values(), ones)
  np.testing.assert_array_equal(fused_recurrent_delta_rule(*x.values())[0], want)
  np.testing.assert_allclose(fused_recurrent_gated_delta_rule(*x.values())[0], want, rtol=1e-6, atol=1e-6)


def test_chunk_linear_attn_normalizes_by_default_and_returns_the_key_sum():
  rng = rng_of("normalize-default")
  x = cases.positive_features(rng, B, T, H, K, V)
  o, (S, z) = chunk_linear_attn(*x.values())
  assert S is None and z.shape == (B, 1, H, K) and z.dtype == jnp.float32
  np.testing.assert_allclose(z, jnp.sum(x["k"], axis=1, keepdims=True), rtol=1e-5)
  np.testing.assert_array_equal(o, chunk_linear_attn(*x.values(), normalize=True)[0])
  o_plain, S_plain = fused_recurrent_linear_attn(*x.values())  # fla's decode op does not normalize
  assert S_plain is None
  np.testing.assert_allclose(o_plain, chunk_linear_attn(*x.values(), normalize=False)[0], rtol=1e-5,
                             atol=1e-5)


def test_normalized_decode_continues_a_prefill_from_its_key_sum():
  harness.check_decode_continuation(cases.LINEAR_ATTN_NORMALIZED, T=40, split=30, K=16, V=16)


# --- **kwargs -----------------------------------------------------------------------------------

def test_kwargs_are_read_as_fla_reads_them():
  x = cases.simple_gla_inputs(rng_of("kwargs"), 1, 16, 2, 8, 8)
  o, _ = chunk_simple_gla(*x.values())
  with pytest.warns(DeprecationWarning, match="head_first has been removed"):
    np.testing.assert_array_equal(chunk_simple_gla(*x.values(), head_first=False)[0], o)
  with pytest.raises(ValueError, match="`head_first=True`"):
    chunk_simple_gla(*x.values(), head_first=True)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    np.testing.assert_array_equal(chunk_simple_gla(*x.values(), chunk_size=16)[0], o)
  with pytest.raises(ValueError, match="`chunk_size` must be a power of 2"):
    chunk_simple_gla(*x.values(), chunk_size=48)
  with pytest.raises(TypeError, match="unexpected keyword argument 'gate_logit_normalizer'"):
    chunk_simple_gla(*x.values(), gate_logit_normalizer=16)
  with pytest.raises(ValueError, match="Cannot pass both `state_v_first` and the deprecated"):
    fused_recurrent_simple_gla(*x.values(), state_v_first=True, transpose_state_layout=True)


# --- every op returns (o, final_state) ---------------------------------------------------------

RETURNING = [(c.name, c) for c in (cases.GLA, cases.SIMPLE_GLA, cases.RETENTION, cases.LINEAR_ATTN,
                                   cases.RWKV6, cases.DELTA_RULE, cases.GDN, cases.KDA, cases.HGRN,
                                   cases.MLSTM)]


@pytest.mark.parametrize("name,case", RETURNING, ids=[n for n, _ in RETURNING])
def test_every_op_returns_o_and_the_final_state_or_none(name, case):
  x = case.make_inputs(rng_of("returns", name), 1, 8, 2, 4, 4)
  state = case.make_state(rng_of("returns-state", name), 1, 2, 4, 4)
  for op in (case.chunk, case.fused_recurrent):
    out = op(*x.values())
    assert isinstance(out, tuple) and len(out) == 2 and out[1] is None
    o, S = op(*x.values(), initial_state=state, output_final_state=True)
    harness.paired_leaves(S, state, "final_state")


def test_fla_aliases():
  assert pallas_kernels.chunk_gdn is chunk_gated_delta_rule
  assert pallas_kernels.fused_recurrent_gdn is fused_recurrent_gated_delta_rule

