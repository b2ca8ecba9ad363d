"""HGRN's gated elementwise recurrence: `chunk_hgrn`, `fused_recurrent_hgrn` (mirroring fla.ops.hgrn)."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.hgrn.transition import TRANSITION

STATE = api.State(("[N, D]",))

_DOC = """HGRN recurrence{kind}, elementwise over the width D (fla's `{fla}_hgrn`).

  h_t = exp(g_t) * h_{t-1} + x_t;  o_t = h_t

fla's convention: the HGRN layer scales its input by (1 - exp(g)) itself before calling the op.

Args:
  x: [B, T, D] inputs.
  g: [B, T, D] natural-log forget gates (<= 0; a positive value raises eagerly, is clamped to 0 under
    jit).
"""


def _run(kind, x, g, initial_state, output_final_state, cu_seqlens, backend, interpret, context_axis):
  d = api.elementwise_dims(x, cu_seqlens, context_axis=context_axis)
  g = api.log_decay_gate("g", g, d, "[B, T, D]")
  return api.run("hgrn", kind, d, (x, g), state=STATE, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis,
                 transition=TRANSITION)


def chunk_hgrn(x, g, initial_state=None, output_final_state=False, *, cu_seqlens=None, backend="auto",
               interpret=False, context_axis=None):
  return _run("chunk", x, g, initial_state, output_final_state, cu_seqlens, backend, interpret,
              context_axis)


def fused_recurrent_hgrn(x, g, initial_state=None, output_final_state=False, cu_seqlens=None,
                         *, backend="auto", interpret=False, context_axis=None):
  return _run("fused_recurrent", x, g, initial_state, output_final_state, cu_seqlens, backend,
              interpret, context_axis)


api.document(_DOC, state=STATE, scale=False, chunk=chunk_hgrn, fused_recurrent=fused_recurrent_hgrn)
