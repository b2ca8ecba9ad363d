"""The gated delta rule's transition for context parallelism: S_t = (I - beta_t k_t k_t^T) exp(g_t)
S_{t-1} + beta_t k_t v_t^T, so a slice maps the state that enters it by a K x K matrix (float32), which
the op itself computes as K extra value columns of the local run (`context.with_transition_columns`,
which reuses every backend). KDA (a per-channel decay) and the delta rule (no decay) use it too."""
from __future__ import annotations

from pallas_kernels.common import context

TRANSITION = context.Transition(None, context.apply_matrix, context.correct_matrix, value_index=2)
