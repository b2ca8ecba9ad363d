"""Linear attention's transition for context parallelism: the identity (S_out = S_in + B), and S_in
reaches o_t through scale q_t."""
from __future__ import annotations

from pallas_kernels.common import context
from pallas_kernels.simple_gla.transition import head_decay


def prefix(call, args, first, scale):
  q = args[0]
  return context.query_factor(q, head_decay(None, None, q.shape[1], q.shape[2]), first, scale)


TRANSITION = context.Transition(prefix, context.apply_diagonal, context.correct_matrix)
