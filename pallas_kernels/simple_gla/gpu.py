"""Simple GLA as Pallas GPU kernels (Triton lowering): its custom_vjp composes the family-free
stages of pallas_kernels/common/gpu/ (the delta rule's stages without w, v' = v):

forward   `chunk_state.state_pass` with o: S = exp(G_C) S + (exp(G_C - G) k)^T v,
          o = scale exp(G) q S + P v, P = lower(scale q k^T exp(G_i - G_j));
backward  `chunk_state.state_pass` storing the chunk-start states h, `chunk_dh.dh_pass` (dh, dv),
          `chunk_dqk.dqk_pass` (dq, dk, dG); dg is the reverse chunk-local cumsum of dG.
Shapes, limits and the padding as in gated_delta_rule/gpu.py (common/gpu/layout.py's `run_chunked`).
"""
from __future__ import annotations

import functools

import jax

from pallas_kernels.common.gpu import chunk_dh, chunk_dqk, chunk_state, layout
from pallas_kernels.common.gpu.config import CHUNK, DEFAULT, Config, Static
from pallas_kernels.common.gpu.fused_recurrent import fused_recurrent
from pallas_kernels.common.gpu.kernel_math import F32
from pallas_kernels.common.gpu.layout import chunk_cumsum, run_chunked
from pallas_kernels.gla.reference import fused_recurrent_gla
from pallas_kernels.simple_gla.reference import scalar_gate

unsupported = layout.unsupported  # the dispatch `supports` hook: (q, k, v, ...) -> reason or None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_simple_gla(st: Static, q, k, v, g, h0, starts, ends):
  """(o, final state) of padded inputs; g [B, H, T] float32 (layout.run_chunked's `core`)."""
  return _chunk_simple_gla_fwd(st, q, k, v, g, h0, starts, ends)[0]


def _chunk_simple_gla_fwd(st, q, k, v, g, h0, starts, ends):
  G = chunk_cumsum(g, CHUNK)
  o, ht, kept = chunk_state.state_pass(q, k, None, v, G, h0, starts, ends, st, want_o=True,
                                       keep_h=st.cfg.keep_states)
  return (o, ht), (q, k, v, G, h0, kept, starts, ends)


def _chunk_simple_gla_bwd(st, res, cts):
  q, k, v, G, h0, kept, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  h, _ = kept or chunk_state.state_pass(None, k, None, v, G, h0, starts, ends, st, want_o=False)
  dh, dv, dh0 = chunk_dh.dh_pass(q, k, None, do, G, dht.astype(F32), starts, ends, st)
  dq, dk, dG, _ = chunk_dqk.dqk_pass(q, k, G, h, dh, do, v, dv, st, want_dw=False)
  dg = chunk_cumsum(dG, CHUNK, reverse=True)
  return dq, dk, dv, dg, dh0, None, None


_chunk_simple_gla.defvjp(_chunk_simple_gla_fwd, _chunk_simple_gla_bwd)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state, cu_seqlens=None,
                     interpret=False, config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g None or [B, T, H]; g_gamma None or [H] (log decays).

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  return run_chunked(_chunk_simple_gla, q, k, v, (scalar_gate(g, g_gamma, q),), scale=scale,
                     initial_state=initial_state, cu_seqlens=cu_seqlens, interpret=interpret,
                     config=config)


def _reference(q, k, v, g, beta, *, scale, initial_state, cu_seqlens):
  del beta  # None: no delta correction
  return fused_recurrent_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                             cu_seqlens=cu_seqlens)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, *, scale, initial_state,
                               cu_seqlens=None, interpret=False):
  """Token by token (decode): common/gpu/fused_recurrent.py without the delta correction."""
  return fused_recurrent(q, k, v, scalar_gate(g, g_gamma, q), None, scale=scale,
                         initial_state=initial_state, cu_seqlens=cu_seqlens, interpret=interpret,
                         reference=_reference)
