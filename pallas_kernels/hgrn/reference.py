"""HGRN's recurrence, token by token in float32: the definition every other path is tested against.

  h_t = exp(g_t) * h_{t-1} + x_t;  o_t = h_t        (elementwise over D)
"""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common.scan import scan_with_resets
from pallas_kernels.common.varlen import token_segments

F32 = jnp.float32


def hgrn(x, g, *, initial_state, cu_seqlens=None):
  """x, g [B, T, D]. Returns (o [B, T, D] float32, final_state [N, D] float32)."""
  B, T, D = x.shape

  def step(h, inputs):
    x_t, g_t = inputs
    h = jnp.exp(g_t) * h + x_t
    return h, h

  time_major = lambda a: jnp.moveaxis(a.astype(F32), 1, 0)
  segments = None if cu_seqlens is None else token_segments(cu_seqlens, T)
  h, o = scan_with_resets(step, initial_state, (time_major(x), time_major(g)), segments)
  return jnp.moveaxis(o, 0, 1), h


def fused_recurrent_hgrn(x, g, *, initial_state, cu_seqlens=None):
  o, h = hgrn(x, g, initial_state=initial_state, cu_seqlens=cu_seqlens)
  return o.astype(x.dtype), h


chunk_hgrn = fused_recurrent_hgrn
