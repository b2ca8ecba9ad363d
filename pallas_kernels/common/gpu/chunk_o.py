"""The chunk-parallel output kernel (like fla's chunk_fwd_o): grid (V / BV, NT, B*H), one chunk and
one value tile per program, from the chunk-start states h that a state pass wrote:

  o = scale exp(G) q h + P v',  P = lower(scale q k^T exp(G_i - G_j))

for scalar gates G [C] (the chunk-local cumsum; zeros without decay). It is the forward's output
when `chunk_state.state_pass` does not fuse it into its serial chunk loop (`config.split_output`):
above K = 128 that loop runs few programs (B * H * V / BV; 64 at the 475M model's B = 1, H = 4,
V = 512), each of its steps lengthened by q h and P v', while here every chunk is a program.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu.config import CHUNK, Static
from pallas_kernels.common.gpu.kernel_math import (F32, decay, dot, dot_nt, key_blocks, precision,
                                                   scale_rows)
from pallas_kernels.common.gpu.layout import launch, sds, value_tile


def _output_kernel(q_ref, k_ref, g_ref, h_ref, vn_ref, o_ref, *, scale, bk):
  """q k^T and q h summed over key tiles of bk: at K = 256 whole [C, K] tiles of q and k took all
  255 registers a thread (sm_90a), two programs an SM."""
  G = g_ref[...]
  dt = q_ref.dtype
  prec = precision(dt)
  row_scales = jnp.exp(G) * scale
  P = jnp.zeros((CHUNK, CHUNK), F32)
  qh = jnp.zeros(o_ref.shape, F32)
  for kt in key_blocks(q_ref.shape[1], bk):
    q = q_ref[:, kt]
    P += dot_nt(q, k_ref[:, kt], prec)
    qh += dot(scale_rows(q, row_scales, dt), h_ref[kt, :], prec)
  P = P * (decay(G) * scale)
  o_ref[...] = (qh + dot(P.astype(dt), vn_ref[...], prec)).astype(o_ref.dtype)


def output_pass(q, k, G, h, vn, st: Static):
  """Padded, chunk-aligned inputs: q, k [B, T, H, K], G [B, H, T] (scalar gates' chunk-local
  cumsums, float32), h [B, NT, H, K, V] (chunk-start states) and v' [B, T, H, V] in the input
  dtype. Returns o [B, T, H, V] in the input dtype."""
  B, T, H, K = q.shape
  V = vn.shape[-1]
  C = CHUNK
  BV = value_tile(V, st.cfg.bv_output)
  tok = lambda D, tiled: pl.BlockSpec((None, C, None, D),
                                      lambda iv, n, bh: (bh // H, n, bh % H, iv if tiled else 0))
  gate = pl.BlockSpec((None, None, C), lambda iv, n, bh: (bh // H, bh % H, n))
  state = pl.BlockSpec((None, None, None, K, BV), lambda iv, n, bh: (bh // H, n, bh % H, 0, iv))
  kern = functools.partial(_output_kernel, scale=st.scale, bk=min(K, 64))
  in_specs = [tok(K, False), tok(K, False), gate, state, tok(BV, True)]
  return launch(kern, (V // BV, T // C, B * H), in_specs, tok(BV, True), sds(vn.shape, q.dtype), st,
                st.cfg.warps_output, st.cfg.stages_chunk)(q, k, G, h, vn)
