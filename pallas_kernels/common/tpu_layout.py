"""Host-side plumbing shared by the Mosaic TPU kernels: interpret parameters, the chunk plan (padding
or varlen re-packing, per-chunk sequence ids and reset flags for scalar prefetch) and the head-major
layout the kernels read.

Kernels see arrays as [B, H, Tp, D] (Tp = N * C, a whole number of chunks), so a block (C, D) is a
chunk of one head: C is a multiple of 16 (the sublane tile is 8) and D is the full last dimension,
which meets Mosaic's rule "last two block dims divisible by (8, 128) or equal to the array's".
Every grid is (batch, head, chunk) with dimension semantics ("parallel", "parallel", "arbitrary").
Two int32 arrays [N] ride along as scalar prefetch (`pltpu.PrefetchScalarGridSpec`), so index maps
and kernels can address per-sequence states:
  seq[n]    sequence of chunk n relative to the batch index (0 without varlen; with cu_seqlens, B == 1
            and it is the packed sequence index) -> state blocks are (b + seq[n], h);
  flags[n]  bit 0: a sequence starts at chunk n (load its initial state), bit 1: one ends there.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.common import varlen

F32 = jnp.float32
START, END = 1, 2
SEMANTICS = ("parallel", "parallel", "arbitrary")


def interpret_params(interpret):
  """False -> compile for TPU; True -> TPU interpret mode on any host, with out-of-bounds reads
  raising and uninitialised memory read as NaN (so a kernel that reads what it never wrote fails);
  an `InterpretParams` instance passes through."""
  if not interpret or isinstance(interpret, pltpu.InterpretParams):
    return interpret
  want = dict(out_of_bounds_reads="raise", uninitialized_memory="nan")
  have = {f.name for f in dataclasses.fields(pltpu.InterpretParams)}
  return pltpu.InterpretParams(**{k: v for k, v in want.items() if k in have})


def compiler_params():
  return pltpu.CompilerParams(dimension_semantics=SEMANTICS)


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


def to_kernel(x, p: Plan, dtype=None):
  """[B, T, H, *D] -> [B, H, N*C, prod(D) or 1], padded (or varlen re-packed) with zeros, which
  leave every state unchanged (zero keys and values, zero log-decays)."""
  B, T, H = x.shape[:3]
  x = x.reshape(B, T, H, -1)
  if dtype is not None:
    x = x.astype(dtype)
  if p.layout is not None:
    x = varlen.pack(x, p.layout)
  else:
    x = jnp.pad(x, ((0, 0), (0, p.N * p.C - T), (0, 0), (0, 0)))
  return jnp.swapaxes(x, 1, 2)


def from_kernel(y, p: Plan):
  """[B, H, N*C, D] -> [B, T, H, D]."""
  y = jnp.swapaxes(y, 1, 2)
  return y[:, :p.T] if p.layout is None else varlen.unpack(y, p.layout)


def chunk_cumsum(g, p: Plan):
  """Chunk-local inclusive cumsum (float32) of kernel-layout gates [B, H, N*C, D]."""
  B, H, Tp, D = g.shape
  return jnp.cumsum(g.reshape(B, H, p.N, p.C, D).astype(F32), axis=3).reshape(B, H, Tp, D)


# --- BlockSpecs (index maps receive the grid indices, then the two scalar-prefetch refs) ----------

def chunk_spec(C: int, D: int, reverse: bool = False, N: int = 0):
  """Chunk n (or N-1-n when walking backwards) of one head of a [B, H, N*C, D] array."""
  if reverse:
    return pl.BlockSpec((None, None, C, D), lambda b, h, n, seq, fl: (b, h, N - 1 - n, 0))
  return pl.BlockSpec((None, None, C, D), lambda b, h, n, seq, fl: (b, h, n, 0))


def state_spec(shape, reverse: bool = False, N: int = 0):
  """The state block [*shape] of the sequence chunk n belongs to, in a [n_seq, H, *shape] array."""
  zeros = (0,) * len(shape)
  if reverse:
    return pl.BlockSpec((None, None, *shape), lambda b, h, n, seq, fl: (b + seq[N - 1 - n], h, *zeros))
  return pl.BlockSpec((None, None, *shape), lambda b, h, n, seq, fl: (b + seq[n], h, *zeros))


def per_chunk_spec(shape, reverse: bool = False, N: int = 0):
  """A [*shape] block per chunk of a [B, H, N, *shape] array (e.g. the chunk-start states)."""
  zeros = (0,) * len(shape)
  if reverse:
    return pl.BlockSpec((None, None, None, *shape), lambda b, h, n, seq, fl: (b, h, N - 1 - n, *zeros))
  return pl.BlockSpec((None, None, None, *shape), lambda b, h, n, seq, fl: (b, h, n, *zeros))


def head_spec(shape):
  """The block of head h of a per-head parameter [H, *shape] (e.g. RWKV-6's bonus u as [H, 1, K])."""
  zeros = (0,) * len(shape)
  return pl.BlockSpec((None, *shape), lambda b, h, n, seq, fl: (h, *zeros))


def call(kernel, grid, seq, flags, in_specs, out_specs, out_shape, scratch_shapes, interpret, name):
  """pallas_call over `grid` = (B, H, N) with (seq, flags) as scalar prefetch."""
  grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
                                           out_specs=out_specs, scratch_shapes=scratch_shapes)
  fn = pl.pallas_call(kernel, out_shape=out_shape, grid_spec=grid_spec,
                      compiler_params=compiler_params(), interpret=interpret_params(interpret),
                      name=name)
  return lambda *args: fn(seq, flags, *args)


def passthrough_empty(final, h0, empty):
  """Sequences without tokens keep their initial state (the kernels never visit them)."""
  return jnp.where(empty[:, None, None, None], h0, final)



# --- in-kernel state handling shared by the chunk kernels --------------------------------------

def load_initial_state(S_ref, h0_ref, flags_ref):
  """Forward, at the top of each grid step: a sequence starting at this chunk loads its state."""
  @pl.when((flags_ref[pl.program_id(2)] & START) != 0)
  def _():
    S_ref[...] = h0_ref[...]


def load_final_state_grad(dS_ref, dfinal_ref, flags_ref, N: int):
  """Backward (chunks in reverse): dS starts at zero and is reset to the final-state cotangent of a
  sequence ending at this chunk."""
  n = pl.program_id(2)

  @pl.when(n == 0)
  def _():
    dS_ref[...] = jnp.zeros_like(dS_ref)

  @pl.when((flags_ref[N - 1 - n] & END) != 0)
  def _():
    dS_ref[...] = dfinal_ref[...]


def chunk_specs(C: int, dims, reverse: bool = False, N: int = 0):
  return [chunk_spec(C, d, reverse, N) for d in dims]


def shapes_like(*xs):
  return [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
