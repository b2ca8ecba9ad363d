"""The delta rule's transition for context parallelism: the gated delta rule's with g = 0, a K x K
matrix computed by the op from the identity state with v = 0."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import context


def prefix(call, args, first, scale):
  q, k, v, beta = args
  cut = lambda x: context.first_segment(x, first)
  return context.identity_run(call, (q, cut(k), jnp.zeros(k.shape, v.dtype), cut(beta)), first)


TRANSITION = context.Transition(prefix, context.apply_matrix, context.correct_matrix)
