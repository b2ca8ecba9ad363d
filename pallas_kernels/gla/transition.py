"""GLA's transition for context parallelism: a per-channel decay, so a slice maps the state that
enters it to diag(exp(sum g)) S_in + B and S_in reaches o_t through scale q_t exp(G_t)."""
from __future__ import annotations

from pallas_kernels.common import context


def prefix(call, args, first, scale):
  q, _, _, g = args
  return context.query_factor(q, g, first, scale)


TRANSITION = context.Transition(prefix, context.apply_diagonal, context.correct_matrix)
