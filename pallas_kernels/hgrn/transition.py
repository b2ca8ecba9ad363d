"""HGRN's transition for context parallelism: an elementwise decay, h_out = exp(sum g) h_in + B,
and h_in reaches o_t = h_t through exp(G_t)."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import context


def prefix(call, args, first, scale):
  _, g = args
  _, G, A = context.segment_decay(g, first)
  return A, jnp.where(first[..., None], jnp.exp(G), 0.0)


TRANSITION = context.Transition(prefix, apply=lambda A, B, S: A * S + B,
                                correct=lambda Q, S: Q * S[:, None])
