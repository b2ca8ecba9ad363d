"""Linear attention (no decay): `chunk_linear_attn`, `fused_recurrent_linear_attn`. Routes through
simple GLA; `normalize=True` divides by fla's running normalizer."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import api
from pallas_kernels.linear_attn.transition import TRANSITION

F32 = jnp.float32
NORMALIZER_EPS = 1e-10  # fla's
Z_STATE = api.State(("[N, 1, H, K]",))

_DOC = """Linear attention{kind} (fla's `{fla}_linear_attn`).

  S_t = S_{t-1} + k_t v_t^T;  o_t = S_t^T (scale q_t)

Args:
  q, k: [B, T, H, K] (usually feature maps phi(q), phi(k)). v: [B, T, H, V].
  normalize (chunk_linear_attn's default True, fused_recurrent_linear_attn's False, as in fla):
    divide o_t by (scale q_t . z_t + 1e-10), z_t = z_0 + sum_{s <= t} k_s over o_t's own sequence
    (float32). The running sum z is a state too: with normalize, initial_state may be the tuple
    (S_0, z_0 [N, 1, H, K]) (a lone S_0 starts z at 0), and the final state is the tuple
    (final_state or None, z [N, 1, H, K] float32): z comes back even without output_final_state,
    as in fla, so a decode continues a prefill's normalizer.
"""


def _run(kind, q, k, v, scale, initial_state, output_final_state, reverse, normalize, cu_seqlens,
         backend, interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  scale = d.K ** -0.5 if scale is None else scale
  z0 = None
  if normalize and isinstance(initial_state, (tuple, list)):
    if len(initial_state) != 2:
      raise ValueError("`initial_state` with normalize=True must be S_0 [N, H, K, V] or the tuple "
                       f"(S_0, z_0 [N, 1, H, K]); got a sequence of length {len(initial_state)}")
    initial_state, z0 = initial_state
  options = dict(cu_seqlens=cu_seqlens, interpret=interpret, context_axis=context_axis,
                 reverse=reverse, transition=TRANSITION)
  o, S = api.run("linear_attn", kind, d, (q, k, v), scale=scale, initial_state=initial_state,
                 output_final_state=output_final_state, backend=backend, **options)
  if not normalize:
    return o, S
  # The normalizer is linear attention with v = 1 from the state z_0 [N, H, K, 1]: its output is
  # scale q_t . z_t and its final state z, on the float32 scan or the xla path (context_axis and
  # reverse included).
  z0 = None if z0 is None else jnp.moveaxis(api.concrete_state(z0, Z_STATE, d), 1, -1)
  den, z = api.run("linear_attn", "chunk", d._replace(V=1),
                   (q.astype(F32), k.astype(F32), jnp.ones(q.shape[:3] + (1,), F32)), scale=scale,
                   initial_state=z0, output_final_state=True,
                   backend="reference" if backend == "reference" else "xla", **options)
  o = (o.astype(F32) / (den + NORMALIZER_EPS)).astype(o.dtype)
  return o, (S, jnp.moveaxis(z, -1, 1))


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                      normalize=True, cu_seqlens=None, *, backend="auto", interpret=False,
                      context_axis=None):
  return _run("chunk", q, k, v, scale, initial_state, output_final_state, False, normalize,
              cu_seqlens, backend, interpret, context_axis)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                reverse=False, normalize=False, cu_seqlens=None, *, backend="auto",
                                interpret=False, context_axis=None):
  return _run("fused_recurrent", q, k, v, scale, initial_state, output_final_state, reverse,
              normalize, cu_seqlens, backend, interpret, context_axis)


api.document(_DOC, chunk=chunk_linear_attn, fused_recurrent=fused_recurrent_linear_attn)
