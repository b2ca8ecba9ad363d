"""Every op family's `harness.OpCase` and the input makers they share: the one place the family
tests, the GPU kernel tests and the TPU kernel tests draw their inputs from.

Input makers take `(rng, B, T, H, K, V)` (a numpy Generator and the harness's shape names) and
return the op's positional inputs as an ordered dict of float32 arrays; gated families take a
`gate_scale` keyword (the extreme-gate tests and `steep` scale the gate logits with it).
"""
import dataclasses
import functools

import jax.numpy as jnp

from pallas_kernels.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
from pallas_kernels.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from pallas_kernels.gla import chunk_gla, fused_recurrent_gla
from pallas_kernels.hgrn import chunk_hgrn, fused_recurrent_hgrn
from pallas_kernels.kda import chunk_kda, fused_recurrent_kda
from pallas_kernels.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
from pallas_kernels.mlstm import chunk_mlstm, fused_recurrent_mlstm
from pallas_kernels.retention import chunk_retention, fused_recurrent_retention
from pallas_kernels.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
from pallas_kernels.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
from tests.pallas_kernels.harness import OpCase, log_sigmoid, normal, sigmoid, unit


# --- shared input makers -------------------------------------------------------------------------

def qkv(rng, B, T, H, K, V, names=("q", "k", "v")):
  return dict(zip(names, (normal(rng, B, T, H, K), normal(rng, B, T, H, K), normal(rng, B, T, H, V))))


def log_decays(rng, *shape, gate_scale=1.0, shift=2.0):
  """log_sigmoid of N(shift, gate_scale^2) logits: log decays <= 0 (down to about -30 at scale 10)."""
  return log_sigmoid(normal(rng, *shape, scale=gate_scale, shift=shift))


def matrix_state(rng, N, H, K, V):
  """The [N, H, K, V] initial state of every family but HGRN and mLSTM."""
  return normal(rng, N, H, K, V, scale=0.5)


# --- additive families: GLA's chunked core and the ops that re-route to it -----------------------

def gla_inputs(rng, B, T, H, K, V, gate_scale=1.0):
  return dict(qkv(rng, B, T, H, K, V), g=log_decays(rng, B, T, H, K, gate_scale=gate_scale))


GLA = OpCase("gla", chunk_gla, fused_recurrent_gla, gla_inputs, matrix_state, gates=("g",))


def rwkv6_inputs(rng, B, T, H, K, V, gate_scale=1.0):
  return dict(qkv(rng, B, T, H, K, V, names=("r", "k", "v")),
              w=log_decays(rng, B, T, H, K, gate_scale=gate_scale), u=normal(rng, H, K, scale=0.5))


RWKV6 = OpCase("rwkv6", chunk_rwkv6, fused_recurrent_rwkv6, rwkv6_inputs, matrix_state, gates=("w",),
               static_inputs=("u",))


def simple_gla_inputs(rng, B, T, H, K, V, gate_scale=1.0, gates=("g", "g_gamma")):
  x = dict(qkv(rng, B, T, H, K, V), g=log_decays(rng, B, T, H, gate_scale=gate_scale),
           g_gamma=log_decays(rng, H, gate_scale=gate_scale, shift=3.0))
  return {n: a for n, a in x.items() if n in ("q", "k", "v") + gates}


def g_gamma_by_keyword(op):
  """The op with g_gamma as its 4th positional input (g left None)."""
  return lambda q, k, v, g_gamma, **kw: op(q, k, v, g_gamma=g_gamma, **kw)


# Simple GLA's three gate modes: both gates, the per-token g only, the per-head constant g_gamma only.
SIMPLE_GLA = OpCase("simple_gla", chunk_simple_gla, fused_recurrent_simple_gla, simple_gla_inputs,
                    matrix_state, gates=("g", "g_gamma"), static_inputs=("g_gamma",))
SIMPLE_GLA_G_ONLY = OpCase("simple_gla[g]", chunk_simple_gla, fused_recurrent_simple_gla,
                           functools.partial(simple_gla_inputs, gates=("g",)), matrix_state,
                           gates=("g",))
SIMPLE_GLA_GAMMA_ONLY = OpCase("simple_gla[g_gamma]", g_gamma_by_keyword(chunk_simple_gla),
                               g_gamma_by_keyword(fused_recurrent_simple_gla),
                               functools.partial(simple_gla_inputs, gates=("g_gamma",)), matrix_state,
                               gates=("g_gamma",), static_inputs=("g_gamma",))

# Retention: simple GLA with the fixed decay log(1 - 2**(-5-h)), so q, k, v are its only inputs.
RETENTION = OpCase("retention", chunk_retention, fused_recurrent_retention, qkv, matrix_state)

# chunk_linear_attn normalizes by default (fla's default); this case is the plain recurrence.
LINEAR_ATTN = OpCase("linear_attn", functools.partial(chunk_linear_attn, normalize=False),
                     fused_recurrent_linear_attn, qkv, matrix_state)


def positive_features(rng, B, T, H, K, V):
  """q and k through a sigmoid: the positive feature maps fla's normalize=True assumes."""
  return dict(q=sigmoid(normal(rng, B, T, H, K)), k=sigmoid(normal(rng, B, T, H, K)),
              v=normal(rng, B, T, H, V))


def normalizer_state(rng, N, H, K, V):
  """normalize=True's state: (S_0, z_0 [N, 1, H, K]), z_0 a positive running key sum."""
  return matrix_state(rng, N, H, K, V), sigmoid(normal(rng, N, 1, H, K))


LINEAR_ATTN_NORMALIZED = OpCase("linear_attn[normalize]",
                                functools.partial(chunk_linear_attn, normalize=True),
                                functools.partial(fused_recurrent_linear_attn, normalize=True),
                                positive_features, normalizer_state)


# --- delta-rule families: the gated delta rule's core and the ops that re-route to it ------------

def gdn_inputs(rng, B, T, H, K, V, gate_scale=1.0):
  return dict(
      q=normal(rng, B, T, H, K),
      k=unit(normal(rng, B, T, H, K)),
      v=normal(rng, B, T, H, V),
      g=log_sigmoid(normal(rng, B, T, H, scale=gate_scale, shift=2.0)),
      beta=sigmoid(normal(rng, B, T, H)),
  )


def beta_by_keyword(op):
  """fused_recurrent_gated_delta_rule with beta as its 5th positional input (fla puts gk, gv there)."""
  return lambda q, k, v, g, beta, **kw: op(q, k, v, g, beta=beta, **kw)


GDN = OpCase("gated_delta_rule", chunk_gated_delta_rule, beta_by_keyword(fused_recurrent_gated_delta_rule),
             gdn_inputs, matrix_state, gates=("g", "beta"))


def delta_rule_inputs(rng, B, T, H, K, V, beta_scale=1.0):
  return dict(
      q=normal(rng, B, T, H, K),
      k=unit(normal(rng, B, T, H, K)),
      v=normal(rng, B, T, H, V),
      beta=sigmoid(normal(rng, B, T, H, scale=beta_scale)),
  )


DELTA_RULE = OpCase("delta_rule", chunk_delta_rule, fused_recurrent_delta_rule, delta_rule_inputs,
                    matrix_state, gates=("beta",))


def kda_inputs(rng, B, T, H, K, V, gate_scale=1.0, gate_shift=2.0):
  return dict(
      q=normal(rng, B, T, H, K),
      k=unit(normal(rng, B, T, H, K)),
      v=normal(rng, B, T, H, V),
      g=log_sigmoid(normal(rng, B, T, H, K, scale=gate_scale, shift=gate_shift)),  # per channel
      beta=sigmoid(normal(rng, B, T, H)),
  )


KDA = OpCase("kda", chunk_kda, fused_recurrent_kda, kda_inputs, matrix_state, gates=("g", "beta"))


# --- HGRN: elementwise on [B, T, D]; the harness's (B, T, H, K, V) shapes map to D = H * V --------

def hgrn_inputs(rng, B, T, H, K, V, gate_scale=1.0, gate_shift=2.0):
  return dict(x=normal(rng, B, T, H * V),
              g=log_sigmoid(normal(rng, B, T, H * V, scale=gate_scale, shift=gate_shift)))


def hgrn_state(rng, N, H, K, V):
  return normal(rng, N, H * V)


def hgrn_out_shape(B, T, H, K, V):
  return (B, T, H * V)


HGRN = OpCase("hgrn", chunk_hgrn, fused_recurrent_hgrn, hgrn_inputs, hgrn_state, gates=("g",),
              out_shape=hgrn_out_shape, scaled=False)


# --- mLSTM: the stabilized (C, n, m) state -------------------------------------------------------

def mlstm_inputs(rng, B, T, H, K, V, gate_scale=1.0, i_shift=0.0, f_shift=3.0):
  return dict(q=normal(rng, B, T, H, K), k=normal(rng, B, T, H, K), v=normal(rng, B, T, H, V),
              i=normal(rng, B, T, H, scale=gate_scale, shift=i_shift),   # exponential input gate
              f=normal(rng, B, T, H, scale=gate_scale, shift=f_shift))   # sigmoid forget gate (~0.95)


def mlstm_state(rng, N, H, K, V):
  return (normal(rng, N, H, K, V, scale=0.5), normal(rng, N, H, K, scale=0.5), normal(rng, N, H))


# The final state's m gets a cotangent too: m is piecewise linear in (i, logf, m0) (a running max), so
# its gradient is defined almost everywhere and both paths take the same branch away from ties; the
# chunked path computes exactly the recurrence's m_t (see xla.py), so its gradients agree.
MLSTM = OpCase("mlstm", chunk_mlstm, fused_recurrent_mlstm, mlstm_inputs, mlstm_state, gates=("i", "f"))


def steep(case, **kw):
  """`case` with gate logits scaled by 10 (log decays down to about -30 per step); `kw` goes to its
  input maker too (e.g. mLSTM's f_shift)."""
  return dataclasses.replace(case, name=case.name + "[steep]",
                             make_inputs=lambda *a: case.make_inputs(*a, gate_scale=10.0, **kw))


# --- fla's options: the calls fla 0.6.0's layers make, and the options they exercise -----------

def with_options(case, suffix, *, chunk=None, fused_recurrent=None, **options):
  """`case` with `options` passed to both ops (or the given op wrappers)."""
  return dataclasses.replace(case, name=f"{case.name}[{suffix}]",
                             chunk=chunk or functools.partial(case.chunk, **options),
                             fused_recurrent=fused_recurrent or functools.partial(case.fused_recurrent,
                                                                                  **options))


def v_first_state(rng, N, H, K, V):
  """The [N, H, V, K] initial state of state_v_first=True."""
  return matrix_state(rng, N, H, V, K)


def raw_gate_inputs(rng, B, T, H, K, V, per_channel=False):
  """What fla's GatedDeltaNet / KDA layers hand the op: raw gate g (a_proj / f_proj outputs), beta
  logits, A_log = log(U(1, 16)) [H] and dt_bias ([H], or [H * K] per channel)."""
  width = (K,) if per_channel else ()
  return dict(q=normal(rng, B, T, H, K), k=normal(rng, B, T, H, K), v=normal(rng, B, T, H, V),
              g=normal(rng, B, T, H, *width), beta=normal(rng, B, T, H),
              A_log=jnp.log(jnp.asarray(rng.uniform(1.0, 16.0, H), jnp.float32)),
              dt_bias=normal(rng, H * (K if per_channel else 1), scale=0.5, shift=-3.0))


def fla_layer_call(op, **options):
  """`op` called as fla's GatedDeltaNet / KDA layer calls it: the raw gate, A_log and dt_bias by
  keyword, L2-normalised q and k, beta logits through 2 sigmoid, the state V-first."""
  return lambda q, k, v, g, beta, A_log, dt_bias, **kw: op(
      q, k, v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True,
      use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
      state_v_first=True, **options, **kw)


GDN_FLA_LAYER = OpCase("gated_delta_rule[fla layer]", fla_layer_call(chunk_gated_delta_rule),
                       fla_layer_call(fused_recurrent_gated_delta_rule), raw_gate_inputs, v_first_state,
                       gates=("g", "beta", "A_log", "dt_bias"), static_inputs=("A_log", "dt_bias"))
KDA_FLA_LAYER = OpCase("kda[fla layer]", fla_layer_call(chunk_kda), fla_layer_call(fused_recurrent_kda),
                       functools.partial(raw_gate_inputs, per_channel=True), v_first_state,
                       gates=("g", "beta", "A_log", "dt_bias"), static_inputs=("A_log", "dt_bias"))
# KDA's bounded gate lower_bound sigmoid(exp(A_log) (g + dt_bias)), with fla's safe_gate.
KDA_LOWER_BOUND = dataclasses.replace(
    KDA_FLA_LAYER, name="kda[fla layer, lower_bound]",
    chunk=fla_layer_call(chunk_kda, lower_bound=-5.0, safe_gate=True),
    fused_recurrent=fla_layer_call(fused_recurrent_kda, lower_bound=-5.0))
# fla's GLA and HGRN-2 layers: the per-key gate as gk, the state V-first.
GLA_FLA_LAYER = dataclasses.replace(
    GLA, name="gla[fla layer]", make_state=v_first_state,
    chunk=functools.partial(chunk_gla, state_v_first=True),
    fused_recurrent=lambda q, k, v, g, **kw: fused_recurrent_gla(q, k, v, gk=g, state_v_first=True, **kw))
