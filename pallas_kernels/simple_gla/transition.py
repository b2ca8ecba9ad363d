"""Simple GLA's transition for context parallelism: one decay a head and step, so a slice maps the
state that enters it to exp(sum (g + g_gamma)) S_in + B; retention and linear attention use
`head_decay` with their own fixed gates."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import context


def head_decay(g, g_gamma, T: int, H: int):
  """The log decay of each token and head, [B or 1, T, H, 1]: g [B, T, H] or None plus g_gamma [H]
  or None (neither: no decay)."""
  log_decay = jnp.zeros((1, T, H, 1), jnp.float32)
  if g is not None:
    log_decay = log_decay + g.astype(jnp.float32)[..., None]
  if g_gamma is not None:
    log_decay = log_decay + g_gamma.astype(jnp.float32)[:, None]
  return log_decay


def prefix(call, args, first, scale):
  q, _, _, g, g_gamma = args
  return context.query_factor(q, head_decay(g, g_gamma, q.shape[1], q.shape[2]), first, scale)


TRANSITION = context.Transition(prefix, context.apply_diagonal, context.correct_matrix)
