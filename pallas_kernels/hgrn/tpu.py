"""HGRN on TPU: a Mosaic kernel for the elementwise recurrence h_t = exp(g_t) h_{t-1} + x_t
(o_t = h_t), forward and backward under one `jax.custom_vjp` (the runner of
common/tpu/state_kernel). `interpret=True` runs it in TPU interpret mode on any host.

The width D is cut into tiles of 128 lanes (or taken whole) that play the role of heads: grid
(batch, width tiles, chunks), dimension semantics ("parallel", "parallel", "arbitrary"), the state a
float32 (1, BD) VMEM scratch. Per chunk, in float32: G = cumsum(g) and h_loc = the decayed prefix
sum of x (log2(C) doubling steps on sublane rotations, every exponent <= 0), h = h_loc + exp(G) S.
The backward kernel runs the adjoint recurrence in reverse with the same doubling:
  lam_t = dh_t + exp(g_{t+1}) lam_{t+1},  dx_t = lam_t,  dg_t = lam_t exp(g_t) h_{t-1},
  dS = exp(g_0) lam_0,  with dh = do (+ the final-state cotangent on the last token).
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels.common.tpu import layout, state_kernel
from pallas_kernels.common.tpu.chunk_math import F32, decayed_prefix, iota, row, shift_rows

LANES = 128


class _Static(NamedTuple):
  N: int
  C: int
  interpret: object


def _states(xs, S):
  """(g, G, h) of a chunk: h_t for every token given the chunk-start state S [1, BD]."""
  x, g = (a.astype(F32) for a in xs)
  G = decayed_prefix(g, None)
  return g, G, decayed_prefix(x, G) + jnp.exp(G) * S


def _forward(st: _Static, xs, S):
  _, _, h = _states(xs, S)
  return h, row(h, st.C - 1)


def _backward(st: _Static, xs, S, do, dS):
  g, G, h = _states(xs, S)
  rows = iota((st.C, 1), 0)
  dh = do.astype(F32) + jnp.where(rows == st.C - 1, dS, 0.0)
  lam = decayed_prefix(dh, G, reverse=True)
  h_prev = jnp.where(rows == 0, S, shift_rows(h, 1))
  return (lam, lam * jnp.exp(g) * h_prev), row(lam * jnp.exp(g), 0)


KERNEL = state_kernel.StateKernel("hgrn", _forward, _backward)


def chunk_hgrn(x, g, *, initial_state, cu_seqlens=None, interpret=False, chunk_size: int = 64):
  """x, g [B, T, D]. Returns (o [B, T, D] in x.dtype, final_state [N, D] float32), exactly like
  xla.py."""
  B, T, D = x.shape
  BD = LANES if D % LANES == 0 else D
  nD = D // BD
  p = layout.plan(B, T, cu_seqlens, chunk_size)
  h0 = initial_state.reshape(-1, nD, 1, BD)
  tiles = lambda a: a.reshape(B, T, nD, BD)
  xs = (layout.to_kernel(tiles(x), p), layout.to_kernel(tiles(g), p, F32))
  o, final = state_kernel.run(KERNEL, _Static(p.N, p.C, interpret), p, xs, h0)
  return layout.from_kernel(o, p).reshape(B, T, D), final.reshape(-1, D)
