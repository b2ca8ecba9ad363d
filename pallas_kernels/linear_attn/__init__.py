"""Linear attention (no decay): `chunk_linear_attn`, `fused_recurrent_linear_attn`. Routes through
simple GLA; `normalize=True` divides by fla's running normalizer."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import api
from pallas_kernels.linear_attn.reference import normalize_output
from pallas_kernels.linear_attn.transition import TRANSITION

F32 = jnp.float32
NORMALIZER_EPS = 1e-10  # normalize_output's

_DOC = """Linear attention{kind} (fla's `{fla}_linear_attn`).

  S_t = S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K] (usually feature maps phi(q), phi(k)). v: [B, T, H, V].
  normalize: divide o_t by (scale q_t . sum_{s <= t} k_s + 1e-10), as fla does. The sum runs over the
    tokens of this call and restarts at each cu_seqlens boundary; it is not part of the state, so
    initial_state does not enter it and a decode that continues a prefill normalizes on its own.
"""


def _run(kind, q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens, backend,
         interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  scale = d.K ** -0.5 if scale is None else scale
  o, S = api.run("linear_attn", kind, d, (q, k, v), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                 interpret=interpret, context_axis=context_axis,
                 transition=TRANSITION)
  if not normalize:
    return o, S
  if context_axis is None:
    return normalize_output(o, q, k, scale, cu_seqlens), S
  # The normalizer's running key sum spans the devices too: it is linear attention with v = 1 from a
  # zero state, so the same context-parallel op computes it (float32, as normalize_output does).
  den, _ = api.run("linear_attn", "chunk", d._replace(V=1),
                   (q.astype(F32), k.astype(F32), jnp.ones(q.shape[:3] + (1,), F32)), scale=scale,
                   initial_state=None, output_final_state=False, cu_seqlens=cu_seqlens, backend="xla",
                   interpret=False, context_axis=context_axis, transition=TRANSITION)
  return (o.astype(F32) / (den + NORMALIZER_EPS)).astype(o.dtype), S


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                      normalize=False, cu_seqlens=None, *, backend="auto", interpret=False,
                      context_axis=None):
  return _run("chunk", q, k, v, scale, initial_state, output_final_state, normalize, cu_seqlens,
              backend, interpret, context_axis)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                normalize=False, cu_seqlens=None, *, backend="auto", interpret=False,
                                context_axis=None):
  return _run("fused_recurrent", q, k, v, scale, initial_state, output_final_state, normalize,
              cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_linear_attn, fused_recurrent=fused_recurrent_linear_attn)
