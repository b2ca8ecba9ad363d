"""The mLSTM, token by token in float32: the definition every other path is tested against
(mlstm_kernels' `mlstm_recurrent_step__native_fw`).

  logf_t = log_sigmoid(f_t);  m_t = max(logf_t + m_{t-1}, i_t)
  C_t = exp(logf_t + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
  n_t = exp(logf_t + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t
  o_t = C_t^T (scale q_t) / (max(|n_t . (scale q_t)|, exp(-m_t)) + EPS)
(exp(-m_t) capped at exp(80) so that it stays finite in float32: see MAX_NEG_LOG_NORM)

m_t carries the input gates' magnitude (~1e4 for input gates of 1e4, where float32 keeps only
~1e-3), so the decay's exponent is formed as (m_{t-1} - m_t) + logf_t: the large terms are
differenced first (exactly, where they are close) and the small logf added after. In the order
written above, logf_t + m_{t-1} would round away logf_t's low bits at every step, and the output,
~1e3 where n . q nears 0, was off by ~10% against float64.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.common.varlen import token_segments

F32 = jnp.float32
HI = lax.Precision.HIGHEST
EPS = 1e-6  # mlstm_kernels' default
# exp(-m) in the normalizer is capped at exp(MAX_NEG_LOG_NORM): once m < -80 (input gates and decayed
# history below exp(-80)) the true exp(-m) exceeds float32's range (from m < -88.7), and inf made the
# output 0 with NaN gradients. Capped, o is at most ~1e-35 |C q| there instead of 0.
MAX_NEG_LOG_NORM = 80.0


def normalizer_floor(m):
  """exp(-m), capped at exp(MAX_NEG_LOG_NORM) so it stays finite (see above)."""
  return jnp.exp(jnp.minimum(-m, MAX_NEG_LOG_NORM))


def mlstm(q, k, v, i, f, *, scale, initial_state, cu_seqlens=None):
  """Returns (o [B, T, H, V] float32, (C [N, H, K, V], n [N, H, K], m [N, H]) float32)."""
  B, T, H, K = q.shape
  q, k, v, i = (x.astype(F32) for x in (q, k, v, i))
  logf = jax.nn.log_sigmoid(f.astype(F32))

  def step(state, x):
    C, n, m = state
    q_t, k_t, v_t, i_t, lf_t = x
    m_new = jnp.maximum(lf_t + m, i_t)
    fa, ia = jnp.exp((m - m_new) + lf_t)[..., None], jnp.exp(i_t - m_new)[..., None]
    C = fa[..., None] * C + ia[..., None] * k_t[..., :, None] * v_t[..., None, :]
    n = fa * n + ia * k_t
    qs = q_t * scale
    num = jnp.einsum("bhkv,bhk->bhv", C, qs, precision=HI)
    den = jnp.maximum(jnp.abs(jnp.einsum("bhk,bhk->bh", n, qs, precision=HI)), normalizer_floor(m_new)) + EPS
    return (C, n, m_new), num / den[..., None]

  time_major = lambda x: jnp.moveaxis(x, 1, 0)
  segments = None if cu_seqlens is None else token_segments(cu_seqlens, T)
  state, o = scan_with_resets(step, tuple(initial_state), tuple(map(time_major, (q, k, v, i, logf))), segments)
  return jnp.moveaxis(o, 0, 1), state


def fused_recurrent_mlstm(q, k, v, i, f, *, scale, initial_state, cu_seqlens=None):
  o, state = mlstm(q, k, v, i, f, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)
  return o.astype(q.dtype), state


chunk_mlstm = fused_recurrent_mlstm
