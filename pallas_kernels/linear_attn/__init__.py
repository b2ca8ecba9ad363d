"""Linear attention (no decay): `chunk_linear_attn`, `fused_recurrent_linear_attn`. Routes through
simple GLA; `normalize=True` divides by fla's running normalizer."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.linear_attn.reference import normalize_output

_DOC = """Linear attention{kind} (fla's `{fla}_linear_attn`).

  S_t = S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K] (usually feature maps phi(q), phi(k)). v: [B, T, H, V].
  normalize: divide o_t by (scale q_t . sum_{s <= t} k_s + 1e-10), as fla does. The sum runs over the
    tokens of this call and restarts at each cu_seqlens boundary; it is not part of the state, so
    initial_state does not enter it and a decode that continues a prefill normalizes on its own.
"""


def _run(kind, q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens, backend,
         interpret):
  d = api.dims(q, k, v, cu_seqlens)
  scale = d.K ** -0.5 if scale is None else scale
  o, S = api.run("linear_attn", kind, d, (q, k, v), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret)
  return (normalize_output(o, q, k, scale, cu_seqlens) if normalize else o), S


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                      normalize=False, cu_seqlens=None, backend="auto", interpret=False):
  return _run("chunk", q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens,
              backend, interpret)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                normalize=False, cu_seqlens=None, backend="auto", interpret=False):
  return _run("fused_recurrent", q, k, v, scale, initial_state, output_final_state, normalize,
              cu_seqlens, backend, interpret)


api.document(_DOC, chunk=chunk_linear_attn, fused_recurrent=fused_recurrent_linear_attn)
