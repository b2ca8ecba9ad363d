"""HGRN's gated elementwise recurrence: `chunk_hgrn`, `fused_recurrent_hgrn` (mirroring fla.ops.hgrn)."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import checks, dispatch

_DOC = """HGRN recurrence{kind_doc}, elementwise over the width D.

  h_t = exp(g_t) * h_{{t-1}} + x_t;  o_t = h_t

fla's convention: the HGRN layer scales its input by (1 - exp(g)) itself before calling the op.
Mirrors fla.ops.hgrn.{name}.

Args:
  x: [B, T, D] inputs.
  g: [B, T, D] natural-log forget gates (<= 0; a positive value raises eagerly, is clamped to 0 under
    jit).
  initial_state: [N, D] (N = B, or the number of sequences with cu_seqlens).
  output_final_state: return the float32 final state [N, D] instead of None.
  cu_seqlens: int32 [N + 1] offsets of packed sequences (B == 1); the state resets at each boundary.
  backend: "auto" | "reference" | "xla" | "gpu" | "tpu".  interpret: run a Pallas kernel interpreted.
Returns:
  (o [B, T, D] in x.dtype, final_state [N, D] float32 or None).
"""


def _run(kind, x, g, initial_state, output_final_state, cu_seqlens, backend, interpret):
  checks.check_rank("x", x, 3, "[B, T, D]")
  checks.check_rank("g", g, 3, "[B, T, D]")
  B, T, D = x.shape
  checks.check_shape("g", g, (B, T, D), "[B, T, D]")
  for name, a in (("x", x), ("g", g)):
    if not jnp.issubdtype(a.dtype, jnp.floating):
      raise ValueError(f"`{name}` must be a floating-point array; got dtype {a.dtype}")
  N = checks.num_sequences(B, T, cu_seqlens)
  checks.check_state("initial_state", initial_state, (N, D), "[N, D]")
  g = checks.log_decay("g", g)
  fn = dispatch.resolve("hgrn", kind, backend, interpret)
  o, h = fn(x, g, initial_state=initial_state, cu_seqlens=cu_seqlens)
  return o, h if output_final_state else None


def chunk_hgrn(x, g, initial_state=None, output_final_state=False, cu_seqlens=None, backend="auto",
               interpret=False):
  return _run("chunk", x, g, initial_state, output_final_state, cu_seqlens, backend, interpret)


def fused_recurrent_hgrn(x, g, initial_state=None, output_final_state=False, cu_seqlens=None,
                         backend="auto", interpret=False):
  return _run("fused_recurrent", x, g, initial_state, output_final_state, cu_seqlens, backend, interpret)


chunk_hgrn.__doc__ = _DOC.format(kind_doc=", chunked (training and prefill)", name="chunk_hgrn")
fused_recurrent_hgrn.__doc__ = _DOC.format(kind_doc=", token by token (decode)", name="fused_recurrent_hgrn")
