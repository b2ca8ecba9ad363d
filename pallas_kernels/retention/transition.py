"""Retention's transition for context parallelism: simple GLA's with the fixed decay gamma_h."""
from __future__ import annotations

from pallas_kernels.common import context
from pallas_kernels.retention.reference import retention_log_decay
from pallas_kernels.simple_gla.transition import head_decay


def prefix(call, args, first, scale):
  q = args[0]
  _, T, H, _ = q.shape
  return context.query_factor(q, head_decay(None, retention_log_decay(H), T, H), first, scale)


TRANSITION = context.Transition(prefix, context.apply_diagonal, context.correct_matrix)
