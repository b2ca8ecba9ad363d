"""mLSTM's transition for context parallelism. The true (unstabilised) state maps affinely,
C_out = exp(F) C_in + C_B with F the sum of log_sigmoid(f) over the slice, but the op carries
(C, n, m) scaled by exp(-m): the combine is taken in log space,

  m' = max(m_in + F, m_B);  C' = exp(m_in + F - m') C_in + exp(m_B - m') C_B  (n likewise),

which is exactly the op's m after the slice when (C_B, n_B, m_B) comes from a run that enters with
m = NO_STATE (so m_B is the slice's own running max). The output normalisation is not linear in
the state, so the outputs come from a second run from S_in (Transition.correct None)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.common import context

NO_STATE = -1e30  # the stabiliser of a state that holds nothing: exp(NO_STATE - m) == 0, finite


def prefix(call, args, first, scale):
  f = args[4]
  F = jnp.sum(context.first_segment(jax.nn.log_sigmoid(f.astype(jnp.float32)), first), axis=1)
  return F, None


def apply(F, B, S):
  (C_B, n_B, m_B), (C, n, m) = B, S
  m_out = jnp.maximum(m + F, m_B)
  old, new = jnp.exp((m - m_out) + F), jnp.exp(m_B - m_out)   # m's magnitude differenced first
  return (old[..., None, None] * C + new[..., None, None] * C_B,
          old[..., None] * n + new[..., None] * n_B, m_out)


def zero_state(S):
  C, n, m = S
  return jnp.zeros_like(C), jnp.zeros_like(n), jnp.full_like(m, NO_STATE)


TRANSITION = context.Transition(prefix, apply, zero_state=zero_state)
