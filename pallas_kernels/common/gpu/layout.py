"""Host-side plumbing of the Pallas GPU stage kernels (Triton lowering): everything outside kernel
bodies that every family's chunked path shares.

- compiler parameters and the `launch` wrapper of `pl.pallas_call`;
- power-of-two padding (Triton loads and stores only power-of-two blocks), the head-major gate
  layout [B, H, T] the kernels read, and chunk-local cumsums of it;
- `Specs`, the BlockSpecs of the two grid shapes:
  chunk-parallel, grid (NT, B*H): one program per chunk and head; blocks [C, D] of [B, T, H, D];
  state pass, grid (V / BV, B*H): one program per value tile and head, looping over the NT chunks
  inside (`lax.fori_loop`) with the float32 state [K, BV] carried in registers; blocks span T;
- `run_chunked`, the input prologue of every chunked op: the limits check (`unsupported`), padding
  K to a power of two (per-channel gates with K), V to a power of two or, above MAX_DIM, to whole
  value tiles, and T to whole chunks (or re-packing cu_seqlens chunk-aligned: common.varlen's chunk
  plan, as the xla paths),
  and undoing the padding. Any V runs in one launch of each kernel: the state passes take its value
  tiles on their grid, the chunk kernels loop over them, so the V-independent work (the WY
  transform's inverse and w, the q/k side of the gradient kernels) is done once.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.common import varlen
from pallas_kernels.common.cost import kernel_cost
from pallas_kernels.common.gpu.config import CHUNK, DEFAULT, Config, Static, in_context
from pallas_kernels.common.gpu.kernel_math import F32

MAX_DIM = 256   # largest key head dim K the kernels hold in registers (and widest power-of-two V)
WIDE_VALUE_TILE = 128  # a V above MAX_DIM is padded to a multiple of this (the widest value tile)
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def compiler_params(num_warps: int, num_stages: int):
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def next_pow2(n: int, minimum: int = 16) -> int:
  p = minimum
  while p < n:
    p *= 2
  return p


def pad_axis(x, axis: int, size: int, value=0.0):
  """Zero-pads (or `value`-pads) `axis` of x up to `size`; a no-op when already that size."""
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def head_major(x):
  """[B, T, H] -> float32 [B, H, T] (the gate layout the kernels read: contiguous per head)."""
  return jnp.swapaxes(x.astype(F32), 1, 2)


def chunk_cumsum(x, C: int, reverse: bool = False, axis: int = -1):
  """Inclusive cumsum within chunks of C along `axis` (length a multiple of C; the time axis: the
  last of head-major scalar gates [B, H, T], 1 of per-channel gates [B, T, H, K]), float32."""
  shape = x.shape
  axis = axis % x.ndim
  x = x.reshape(*shape[:axis], shape[axis] // C, C, *shape[axis + 1:])
  if reverse:
    x = jnp.flip(jnp.cumsum(jnp.flip(x, axis + 1), axis=axis + 1), axis + 1)
  else:
    x = jnp.cumsum(x, axis=axis + 1)
  return x.reshape(shape)


def _gate_cumsum_kernel(g_ref, G_ref):
  G_ref[...] = jnp.cumsum(g_ref[...].astype(F32), axis=0)


def gate_cumsum(g, st: Static, warps: int = 4):
  """`chunk_cumsum` of per-channel gates g [B, T, H, K] (T a multiple of CHUNK) as one kernel,
  grid (NT, B*H): G float32, each chunk read and written once."""
  B, T, H, K = g.shape
  sp = Specs(H, CHUNK, T)
  return launch(_gate_cumsum_kernel, (sp.NT, B * H), [sp.chunk_tok(K)], sp.chunk_tok(K),
                sds(g.shape, F32), st, warps, st.cfg.stages_chunk)(g)


class Specs:
  """BlockSpecs for arrays of a [B, T, H, ...] problem with H heads and chunk size C.

  `chunk_*` specs index a chunk-parallel grid (n, bh); `seq_*` specs a state-pass grid (iv, bh)
  whose blocks span the whole (padded) time axis T. The value tile iv is the first grid axis, which
  the Triton launch varies fastest: the programs of one head run side by side and share its keys
  through L2 (with bh first, at 2,048 programs they ran a wave apart and each read them from HBM).
  """

  def __init__(self, H: int, C: int, T: int):
    self.H, self.C, self.T, self.NT = H, C, T, T // C

  # tokens [B, T, H, D]
  def chunk_tok(self, D):
    H = self.H
    return pl.BlockSpec((None, self.C, None, D), lambda n, bh: (bh // H, n, bh % H, 0))

  def seq_tok(self, D, tiled=False):
    H = self.H
    if tiled:  # D is the value tile BV: block iv of the last axis
      return pl.BlockSpec((None, self.T, None, D), lambda iv, bh: (bh // H, 0, bh % H, iv))
    return pl.BlockSpec((None, self.T, None, D), lambda iv, bh: (bh // H, 0, bh % H, 0))

  # scalar gates [B, H, T] (float32); per-channel gates [B, T, H, K] (float32) with K given
  def chunk_gate(self, K=None):
    H = self.H
    if K is not None:
      return self.chunk_tok(K)
    return pl.BlockSpec((None, None, self.C), lambda n, bh: (bh // H, bh % H, n))

  def seq_gate(self, K=None):
    H = self.H
    if K is not None:
      return self.seq_tok(K)
    return pl.BlockSpec((None, None, self.T), lambda iv, bh: (bh // H, bh % H, 0))

  # per-chunk states [B, NT, H, K, V]
  def chunk_state(self, K, V):
    H = self.H
    return pl.BlockSpec((None, None, None, K, V), lambda n, bh: (bh // H, n, bh % H, 0, 0))

  def seq_state(self, K, BV):
    H = self.H
    return pl.BlockSpec((None, self.NT, None, K, BV), lambda iv, bh: (bh // H, 0, bh % H, 0, iv))

  # initial / final states [N, H, K, V]: one per program (batch b) or all N (varlen, B == 1)
  def seq_h0(self, K, BV, N=None):
    H = self.H
    if N is None:
      return pl.BlockSpec((None, None, K, BV), lambda iv, bh: (bh // H, bh % H, 0, iv))
    return pl.BlockSpec((N, None, K, BV), lambda iv, bh: (0, bh % H, 0, iv))

  # per-chunk int32 flags [NT] (varlen segment starts / ends)
  def seq_flags(self):
    return pl.BlockSpec((self.NT,), lambda iv, bh: (0,))


def sds(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


def spec_if(x, spec):
  """`spec`, or None where the operand x is absent (None: the kernel gets a None ref)."""
  return None if x is None else spec


def launch(kernel, grid, in_specs, out_specs, out_shape, st: Static, warps, stages, aliases=None):
  """`pl.pallas_call` with the Triton compiler parameters: the kernel as a function of its
  inputs."""
  return call(kernel, grid, in_specs, out_specs, out_shape, interpret=st.interpret, warps=warps,
              stages=stages, aliases=aliases)


def call(kernel, grid, in_specs, out_specs, out_shape, *, interpret, warps, stages, aliases=None,
         loop_trips=None):
  """`launch` for kernels outside a chunked custom_vjp (no `Static`); `loop_trips`: the trip count
  of a loop whose bounds are read from refs, for the cost estimate (`kernel_cost`). Inputs and
  outputs may be None (their refs are None in the kernel, as in jax's Pallas flash attention);
  `aliases` {input: output} count positions in the lists with their None entries, and an alias
  of an absent input is dropped."""
  pallas = functools.partial(pl.pallas_call, kernel, grid=grid, in_specs=in_specs,
                             out_specs=out_specs, out_shape=out_shape,
                             compiler_params=compiler_params(warps, stages), interpret=interpret)

  def run(*args):
    flat = {_present_index(args, i): _present_index(out_shape, j)
            for i, j in (aliases or {}).items() if args[i] is not None}
    cost = kernel_cost(pallas(input_output_aliases=flat), *args, loop_trips=loop_trips)
    return pallas(input_output_aliases=flat, cost_estimate=cost)(*args)
  return run


def _present_index(items, i):
  """Position i of a list with absent (None) entries among its present ones: pallas_call flattens
  its arguments and results, so None inputs and outputs (absent refs) take no index."""
  return sum(x is not None for x in items[:i])


# --- the input prologue of the chunked ops --------------------------------------------------------

def unsupported(q, k, v, g=None, *_, **__) -> str | None:
  """Why the GPU stage kernels cannot run these inputs (None when they can): the dispatch `supports`
  hook of every family built on them."""
  K = q.shape[-1]
  if K > MAX_DIM:
    return f"key head dim K={K} above {MAX_DIM}"
  if q.dtype not in DTYPES:
    return f"dtype {q.dtype} (supported: bfloat16, float16, float32)"
  return None


def padded_value_dim(V: int) -> int:
  """The value dim the kernels run: a power of two up to MAX_DIM; above it a multiple of
  WIDE_VALUE_TILE, which every value tile divides. Only loaded and stored tiles must be powers of
  two: the chunk kernels' whole-V blocks are loops over tiles (`kernel_math.over_value_tiles`), and
  the state passes' grid takes V / BV tiles."""
  if V <= MAX_DIM:
    return next_pow2(V)
  return -(-V // WIDE_VALUE_TILE) * WIDE_VALUE_TILE


def value_tile(V: int, bv: int) -> int:
  """The value tile of a state pass's grid over V columns: bv, or V when narrower."""
  bv = min(bv, V)
  if V % bv:
    raise ValueError(f"value tile {bv} does not divide V={V}")
  return bv


def run_chunked(core, q, k, v, gates, per_head=(), *, scale, initial_state, cu_seqlens=None,
                interpret=False, config: Config = DEFAULT, family_config=None,
                check=unsupported):
  """Runs a family's chunked custom_vjp `core` on padded, chunk-aligned inputs.

  q, k [B, T, H, K]; v [B, T, H, V]; gates: a tuple of per-token scalars [B, T, H] (log decays,
  beta; None reads as zeros) or per-channel log decays [B, T, H, K]; per_head: a tuple of
  per-head parameters [H, K] (RWKV-6's bonus u) or None.
  `core(st: Static, q, k, v, *gates, *per_head, h0, starts, ends)` gets the gates in float32,
  scalars head-major [B, H, T] and per-channel ones [B, T, H, K] (K padded), the per-head
  parameters float32 with K padded, and returns (o, final state) of the padded problem;
  `starts`/`ends` are the varlen segment flags per chunk (None without cu_seqlens). `family_config`
  becomes `st.family_cfg`; `check(q, k, v, *gates)` says why the kernels cannot run the inputs
  (the family's dispatch hook, where its kernels have limits of their own).
  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
  """
  reason = check(q, k, v, *gates[:1])
  if reason:
    raise ValueError(f"the Pallas GPU kernels cannot run these inputs: {reason}; use backend='xla'")
  B, T, H, K = q.shape
  V, dt, C = v.shape[-1], q.dtype, CHUNK
  Kp, Vp = next_pow2(K), padded_value_dim(V)
  k, v = k.astype(dt), v.astype(dt)
  # The barrier keeps XLA from constant-folding the chunk cumsum of a constant gate (none, or
  # retention's fixed decays): linear attention's fwd+bwd took 28 s to compile at B=8 T=8192 on
  # the H200 (XLA warned of a slow constant fold), the other simple-GLA ops 8-9 s. Per-channel
  # gates [B, T, H, K] come from data and go without: a barrier would write the clamped gates
  # out whole before the cumsum reads them again.
  gates = [jnp.zeros((B, T, H), F32) if x is None else x.astype(F32) for x in gates]
  gates = [x if x.ndim == 4 else jax.lax.optimization_barrier(x) for x in gates]

  plan = varlen.chunk_plan(T, C, cu_seqlens)
  q, k, v, *gates = (varlen.to_chunked(x, plan) for x in (q, k, v, *gates))
  starts, ends = plan.segments or (None, None)
  q, k = pad_axis(q, 3, Kp), pad_axis(k, 3, Kp)
  v = pad_axis(v, 3, Vp)
  h0 = pad_axis(pad_axis(initial_state, 2, Kp), 3, Vp)
  gates = [head_major(x) if x.ndim == 3 else pad_axis(x, 3, Kp) for x in gates]
  per_head = [None if x is None else pad_axis(x.astype(F32), 1, Kp) for x in per_head]
  st = Static(float(scale), cu_seqlens is not None, bool(interpret), in_context(config),
              family_config)
  o, S = core(st, q, k, v, *gates, *per_head, h0, starts, ends)
  return varlen.from_chunked(o[..., :V], plan), S[:, :, :K, :V]
