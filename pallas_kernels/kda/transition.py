"""KDA's transition for context parallelism: the gated delta rule's (a K x K matrix computed as K
extra value columns of the local run; the per-channel decay enters it through the op)."""
from __future__ import annotations

from pallas_kernels.gated_delta_rule.transition import TRANSITION  # noqa: F401  (v is the 3rd input too)
