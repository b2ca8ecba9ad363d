"""Packed variable-length sequences (`cu_seqlens`, FlashAttention-style offsets [0, ..., T], B == 1).

Two views of the same packing:
- `token_segments`: for a token-by-token scan, which sequence starts or ends at each step.
- `chunk_layout`: for the chunked paths, a re-packing in which every sequence starts on a chunk
  boundary (padding tokens in between), so the chunked algorithm only has to reset its state at
  chunk boundaries. Padding tokens are filled with values that leave the state unchanged (zero keys,
  zero gates, ...), so the state at the end of a sequence's last chunk is its final state.
`chunk_plan`, `to_chunked` and `from_chunked` are the input prologue and output epilogue of the
chunked xla and GPU paths: whole chunks by padding the end, or by that re-packing with cu_seqlens.
All arrays are computed with jnp, so `cu_seqlens` may be traced; shapes depend on T, C and N only.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


def sequence_index(offsets, positions):
  """For each position, the index i with offsets[i] <= position < offsets[i + 1] (int32). A loop-free
  binary search: jnp.searchsorted's default is a while loop, which on a GPU costs a device-to-host
  round trip per step, in every layer of every training step."""
  i = jnp.searchsorted(offsets, positions, side="right", method="scan_unrolled")
  return i.astype(jnp.int32) - 1


class Segments(NamedTuple):
  """Per scan step (token or chunk): index of the sequence starting / ending there, else -1."""
  starts: jnp.ndarray
  ends: jnp.ndarray


class ChunkLayout(NamedTuple):
  src: jnp.ndarray       # [N_chunks * C]: packed token index for each padded slot (T = padding)
  dst: jnp.ndarray       # [T]: padded slot of each packed token
  segments: Segments     # per chunk


def token_segments(cu_seqlens, T: int) -> Segments:
  cu = cu_seqlens.astype(jnp.int32)
  t = jnp.arange(T, dtype=jnp.int32)
  seq = sequence_index(cu, t)
  starts = jnp.where(t == cu[seq], seq, -1)
  ends = jnp.where(t == cu[seq + 1] - 1, seq, -1)
  return Segments(starts, ends)


def chunk_layout(cu_seqlens, T: int, C: int) -> ChunkLayout:
  cu = cu_seqlens.astype(jnp.int32)
  n_seq = cu.shape[0] - 1
  n_chunks = (T + n_seq * (C - 1)) // C  # static bound on sum(ceil(len / C))
  lens = cu[1:] - cu[:-1]
  first = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum((lens + C - 1) // C)])  # [N+1]
  t = jnp.arange(T, dtype=jnp.int32)
  tseq = sequence_index(cu, t)
  dst = first[tseq] * C + (t - cu[tseq])
  c = jnp.arange(n_chunks, dtype=jnp.int32)
  used = c < first[-1]
  cseq = jnp.minimum(sequence_index(first, c), n_seq - 1)
  starts = jnp.where(used & (c == first[cseq]), cseq, -1)
  ends = jnp.where(used & (c == first[cseq + 1] - 1), cseq, -1)
  p = jnp.arange(n_chunks * C, dtype=jnp.int32)
  pc = p // C
  local = (pc - first[cseq[pc]]) * C + p % C
  src = jnp.where(used[pc] & (local < lens[cseq[pc]]), cu[cseq[pc]] + local, T)
  return ChunkLayout(src, dst, Segments(starts, ends))


class ChunkPlan(NamedTuple):
  """How [B, T, ...] maps onto whole chunks of C tokens: padded at the end (`layout` None), or
  re-packed chunk-aligned (cu_seqlens, B == 1)."""
  T: int
  C: int
  layout: ChunkLayout | None

  @property
  def segments(self) -> Segments | None:
    """The per-chunk sequence starts / ends (`ChunkLayout.segments`); None without cu_seqlens."""
    return None if self.layout is None else self.layout.segments


def chunk_plan(T: int, C: int, cu_seqlens=None) -> ChunkPlan:
  return ChunkPlan(T, C, None if cu_seqlens is None else chunk_layout(cu_seqlens, T, C))


def to_chunked(x, plan: ChunkPlan, pad_value=0.0):
  """[B, T, ...] -> [B, N * C, ...]: padded at the end, or re-packed, with `pad_value` (a value that
  leaves the state unchanged)."""
  if plan.layout is not None:
    return pack(x, plan.layout, pad_value)
  extra = -plan.T % plan.C
  if extra == 0:
    return x
  widths = [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)
  return jnp.pad(x, widths, constant_values=pad_value)


def from_chunked(y, plan: ChunkPlan):
  """[B, N * C, ...] -> [B, T, ...]: `to_chunked` undone."""
  return y[:, :plan.T] if plan.layout is None else unpack(y, plan.layout)


def pack(x, layout: ChunkLayout, pad_value=0.0):
  """[1, T, ...] -> [1, N_chunks * C, ...] in the chunk-aligned layout."""
  pad = jnp.full((1, 1, *x.shape[2:]), pad_value, x.dtype)
  return jnp.concatenate([x, pad], axis=1)[:, layout.src]


def unpack(x, layout: ChunkLayout):
  """[1, N_chunks * C, ...] -> [1, T, ...]."""
  return x[:, layout.dst]
