"""mLSTM on TPU: the Mosaic kernel of pallas_kernels/common/tpu_mlstm.py (state (C, n, m) in three
float32 VMEM scratches). `interpret=True` runs it in TPU interpret mode on any host."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.common.tpu import layout, state_kernel
from pallas_kernels.common.tpu_mlstm import KERNEL, Static
from pallas_kernels.mlstm.reference import EPS, initial_states
from pallas_kernels.mlstm.xla import NO_INPUT

F32 = jnp.float32


def chunk_mlstm(q, k, v, i, f, *, scale, initial_state=None, cu_seqlens=None, interpret=False,
                chunk_size: int = 64):
  """q, k [B, T, H, K]; v [B, T, H, V]; i, f [B, T, H] pre-activations.

  Returns (o [B, T, H, V] in q.dtype, (C [N, H, K, V], n [N, H, K], m [N, H]) float32), exactly
  like xla.py.
  """
  H, K = q.shape[2:]
  p, _, qkv = layout.qkv_inputs(q, k, v, None, cu_seqlens, chunk_size)  # the state is a tuple here
  C0, n0, m0 = initial_states(initial_state, p.n_seq, H, K, v.shape[-1])
  logf = layout.to_rows(layout.to_kernel(jax.nn.log_sigmoid(f.astype(F32)), p, F32), p)
  xs = (*qkv, logf, layout.to_rows(layout.to_kernel(i, p, F32, pad_value=NO_INPUT), p))
  st = Static(p.N, p.C, float(scale), EPS, interpret)
  o, (C, n, m) = state_kernel.run(KERNEL, st, p, xs, (C0, n0[:, :, None], m0[:, :, None, None]))
  return layout.from_kernel(o, p), (C, n[:, :, 0], m[:, :, 0, 0])
