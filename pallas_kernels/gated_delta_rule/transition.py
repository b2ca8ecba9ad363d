"""The gated delta rule's transition for context parallelism: S_t = (I - beta_t k_t k_t^T) exp(g_t)
S_{t-1} + ..., so a slice maps the state that enters it by a K x K matrix, computed by the op itself
from the identity state with v = 0 (`context.identity_run`, which reuses every backend)."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import context


def prefix(call, args, first, scale):
  q, k, v, g, beta = args
  cut = lambda x: context.first_segment(x, first)
  return context.identity_run(call, (q, cut(k), jnp.zeros(k.shape, v.dtype), cut(g), cut(beta)), first)


TRANSITION = context.Transition(prefix, context.apply_matrix, context.correct_matrix)
