"""Host-side layout shared by the Mosaic TPU kernels: the chunk plan (padding or varlen re-packing,
per-chunk sequence ids and reset flags) and the head-major layout the kernels read.

Kernels see arrays as [B, H, Tp, D] (Tp = N * C, a whole number of chunks), so a block (C, D) is a
chunk of one head: C is a multiple of 16 (the sublane tile is 8) and D is the full last dimension,
which meets Mosaic's rule "last two block dims divisible by (8, 128) or equal to the array's".
The plan's two int32 arrays [N] ride along as scalar prefetch (see state_kernel), so index maps and
kernels can address per-sequence states:
  seq[n]    sequence of chunk n relative to the batch index (0 without varlen; with cu_seqlens,
            B == 1 and it is the packed sequence index) -> state blocks are (b + seq[n], h);
  flags[n]  bit 0: a sequence starts at chunk n (load its initial state), bit 1: one ends there.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from pallas_kernels.common import varlen

F32 = jnp.float32
START, END = 1, 2


def round_up(x: int, m: int) -> int:
  return -(-x // m) * m


class Plan(NamedTuple):
  """How [B, T, ...] maps onto kernel chunks. `layout` is None without cu_seqlens."""
  B: int
  T: int
  C: int
  N: int                      # chunks per batch row
  n_seq: int                  # states: B, or the number of packed sequences
  layout: varlen.ChunkLayout | None
  seq: jnp.ndarray            # [N] int32
  flags: jnp.ndarray          # [N] int32
  empty: jnp.ndarray          # [n_seq] bool: sequences without tokens (state passes through)


def plan(B: int, T: int, cu_seqlens=None, chunk_size: int = 64) -> Plan:
  """Chunk size: `chunk_size`, or less for short inputs (a multiple of 16, the sub-chunk size)."""
  C = max(16, min(round_up(chunk_size, 16), round_up(T, 16)))
  if cu_seqlens is None:
    N = round_up(T, C) // C
    n = jnp.arange(N, dtype=jnp.int32)
    flags = jnp.where(n == 0, START, 0) | jnp.where(n == N - 1, END, 0)
    return Plan(B, T, C, N, B, None, jnp.zeros(N, jnp.int32), flags.astype(jnp.int32),
                jnp.zeros(B, bool))
  layout = varlen.chunk_layout(cu_seqlens, T, C)
  starts, ends = layout.segments
  seq = jnp.maximum(lax.cummax(starts, axis=0), 0).astype(jnp.int32)
  flags = (jnp.where(starts >= 0, START, 0) | jnp.where(ends >= 0, END, 0)).astype(jnp.int32)
  cu = cu_seqlens.astype(jnp.int32)
  return Plan(B, T, C, seq.shape[0], cu.shape[0] - 1, layout, seq, flags, cu[1:] == cu[:-1])


def to_kernel(x, p: Plan, dtype=None, pad_value=0.0):
  """[B, T, H, *D] -> [B, H, N*C, prod(D) or 1], padded (or varlen re-packed) with `pad_value`;
  zeros leave every state unchanged (zero keys and values, zero log-decays)."""
  B, T, H = x.shape[:3]
  x = x.reshape(B, T, H, -1)
  if dtype is not None:
    x = x.astype(dtype)
  if p.layout is not None:
    x = varlen.pack(x, p.layout, pad_value)
  else:
    x = jnp.pad(x, ((0, 0), (0, p.N * p.C - T), (0, 0), (0, 0)), constant_values=pad_value)
  return jnp.swapaxes(x, 1, 2)


def from_kernel(y, p: Plan):
  """[B, H, N*C, D] -> [B, T, H, D]."""
  y = jnp.swapaxes(y, 1, 2)
  return y[:, :p.T] if p.layout is None else varlen.unpack(y, p.layout)


def to_rows(x, p: Plan):
  """Per-token scalars in kernel layout [B, H, N*C, 1] -> rows [B, H, N, 1, C], one (1, C) block per
  chunk (a (C, 1) block would be padded to 128 lanes, in VMEM and in HBM tiles)."""
  B, H = x.shape[:2]
  return x.reshape(B, H, p.N, 1, p.C)


def log_gates(g, p: Plan, H: int):
  """Log-decay gates [B, T, H] or [B, T, H, K] (None: no decay) -> float32 g and its chunk-local
  inclusive cumsum G, as rows [B, H, N, 1, C] for a scalar gate, else [B, H, N*C, K]."""
  g = to_kernel(jnp.zeros((p.B, p.T, H), F32) if g is None else g, p, F32)
  B, H, Tp, D = g.shape
  G = jnp.cumsum(g.reshape(B, H, p.N, p.C, D), axis=3).reshape(B, H, Tp, D)
  return (to_rows(g, p), to_rows(G, p)) if D == 1 else (g, G)


def qkv_inputs(q, k, v, cu_seqlens, chunk_size: int):
  """What every (q, k, v) op prepares: (plan, (q, k, v) in kernel layout with k and v in q's
  dtype)."""
  p = plan(q.shape[0], q.shape[1], cu_seqlens, chunk_size)
  return p, (to_kernel(q, p), to_kernel(k, p, q.dtype), to_kernel(v, p, q.dtype))

