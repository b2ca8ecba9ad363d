"""KDA's transition for context parallelism: the gated delta rule's with a per-channel decay, a
K x K matrix computed by the op from the identity state with v = 0."""
from __future__ import annotations

from pallas_kernels.gated_delta_rule.transition import TRANSITION  # noqa: F401  (same argument order)
