"""RWKV-6's transition for context parallelism: GLA's per-channel decay, except that o_t reads
S_{t-1} (plus the bonus of the current token, which does not involve the state), so S_in reaches o_t
through scale r_t exp(G_{t-1})."""
from __future__ import annotations

from pallas_kernels.common import context


def prefix(call, args, first, scale):
  r, _, _, w, _ = args
  return context.query_factor(r, w, first, scale, exclusive=True)


TRANSITION = context.Transition(prefix, context.apply_diagonal, context.correct_matrix)
