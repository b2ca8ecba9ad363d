"""Tile sizes and launch parameters of the Pallas GPU stage kernels, and the static (hashable,
non-differentiated) arguments every stage and every family's custom_vjp carries."""
from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

from pallas_kernels.common import segments
from pallas_kernels.common.chunk import CHUNK  # noqa: F401  (tokens per chunk of every stage)


class Config(NamedTuple):
  """Tile sizes and launch parameters of the shared stages and of the scalar-gate families' own
  kernels (benchmarks/ops.py times variants). The `*_wy*` fields are read by the gated delta rule's
  WY/UT kernels (gated_delta_rule/gpu.py). A family with kernels of its own (GLA, KDA) has its own
  `Config`, holding this one as `shared`."""
  bv_state: int | None = None  # value tile of the state passes (forward and reverse); None:
                          # state_value_block's choice
  bv_dh: int | None = None  # the dh pass's value tile where it differs from bv_state's
  bk_state: int | None = None  # the state passes hold their state as blocks of this many key rows
                          # and split each product over K alike; None: state_key_block's default
  warps_state: int = 4
  stages_state: int = 2
  stages_dh: int | None = None  # the dh pass's stages where they differ from stages_state's
  split_output: bool | None = None  # the forward's output by chunk_o.output_pass after the state
                          # pass instead of inside its chunk loop; None: split_output's default
  bv_output: int = 64     # value tile of the chunk-parallel output kernel
  split_dv_local: bool | None = None  # the backward's P^T do by chunk_dh.dv_local_pass before the
                          # dh pass instead of inside its chunk loop; None: split_dv_local's default
  warps_output: int = 4
  warps_wy: int = 2       # forward WY/UT kernel (anchor-shape forward on the H200: 0.516 ms at
                          # 2 warps, 0.564 at 4, 0.818 at 8; its 16x16 dots fill few warps)
  bk_dqkw: int = 64       # key tile (grid axis) of the dq/dk/dw kernel
  warps_dqkw: int = 4
  warps_wy_bwd: int = 8
  stages_wy_bwd: int | None = None  # the WY backward's stages where they differ from stages_chunk's
                          # (compiled for sm_90a at K = 256: 196 bytes of spills a thread at one
                          # stage, 36 at two)
  bk_wy_bwd: int | None = None  # keys per tile of the WY backward's loops over K; None:
                          # gated_delta_rule.gpu.wy_bwd_key_block's choice
  keep_wu: bool | None = None  # the forward keeps w and u for the backward (else the inverse T
                          # alone); None: gated_delta_rule.gpu.keeps_w_u's choice
  keep_states: bool = False  # the forward keeps what the backward would form again: the
                          # chunk-start states h, the delta rule's v' and (unless keep_wu says
                          # otherwise) w and u, so the backward runs no state pass of its own.
                          # B*T/64 * H*K*V values of the input dtype a call for h, B*T*H*V for v'
                          # (the 475M GDN's layer at 32,768 tokens: 0.5 + 0.125 GiB, w and u 0.19
                          # more) against one serial pass over the chunks; `states_kept` sets it
                          # for a trace
  stages_chunk: int = 1   # chunk-parallel kernels
  bv_chunk: int = 64      # value tile of the loops inside the backward chunk kernels
  unrolled_value_columns: int = 256  # the chunk kernels' value-tile loops are unrolled up to this
                                     # V, a fori_loop above (kernel_math.over_value_tiles)


DEFAULT = Config()


_STATES_KEPT = contextvars.ContextVar("states_kept", default=False)


@contextlib.contextmanager
def states_kept(keep: bool = True):
  """GPU chunk ops traced inside run with `Config.keep_states` (fla's `disable_recompute`): their
  forward keeps the states and the WY factors for the backward instead of the backward forming
  them again, trading memory for a serial pass (ModelConfig.keep_states sets it for a model).
  keep=False leaves an enclosing block's choice as it is."""
  token = _STATES_KEPT.set(_STATES_KEPT.get() or keep)
  try:
    yield
  finally:
    _STATES_KEPT.reset(token)


def in_context(cfg: Config) -> Config:
  """`cfg` with keep_states on where a `states_kept` block asks for it."""
  return cfg._replace(keep_states=True) if _STATES_KEPT.get() and not cfg.keep_states else cfg


class Static(NamedTuple):
  """The non-differentiated arguments of a chunked custom_vjp (its nondiff_argnums), passed on to
  every stage."""
  scale: float
  is_varlen: bool   # packed sequences (cu_seqlens): states reset at the chunk-aligned boundaries
  interpret: bool
  cfg: Config       # the shared stages' tiles and launch parameters
  family_cfg: NamedTuple | None = None  # those of the family's own kernels (its `Config`), if any


def state_key_block(cfg: Config, K: int, per_channel: bool) -> int:
  """Key rows per state block of the state / dh passes. Up to K = 128 the state is one block (the
  kernels as tuned at the anchor shape). Above, scalar-gate passes hold it as [64, BV] blocks, as
  fla does at K = 256: one [256, BV] block needs 172 / 189 KB of shared memory, so one program fits
  an SM, where [64, BV] blocks let two share it (faster at fla's 340M head dims on the H200: 4.595
  vs 5.944 ms fwd+bwd at B=8 T=4096). The per-channel passes (KDA) keep one block there until
  timed."""
  if cfg.bk_state is not None:
    return cfg.bk_state
  return 64 if K > 128 and not per_channel else K


def state_value_block(cfg: Config, B: int, H: int, K: int, V: int, per_channel: bool,
                      is_varlen: bool, dh: bool = False) -> int:
  """Value columns per program of the state and dh passes, whose grid is (V / BV, B x H): 32, or
  16 for scalar gates above K = 128 when 32 would launch fewer programs than the GPU has SMs (each
  program walks every chunk in turn, so an idle SM is never made up). At the 475M GDN's head dims
  (B=1 H=4 K=256 V=512: 64 programs at 32, 128 at 16) on an H100, fwd / fwd+bwd 2.14 / 8.50 ms
  at 16 against 2.20 / 8.85 at 32; at B=8 T=4096 (512 programs at 32) 16 was 36% slower on the
  H200. The programs count the segments (`common.segments`, a vmap axis whose size this call
  sees). Packed sequences (varlen) keep 32: lineax_lm runs each packed row as a B=1 call under a
  vmap of rows this call cannot count. `cfg.bv_state` overrides, for the dh pass (`dh`)
  `cfg.bv_dh` first: the forward alone ran faster at 64 (fwd 1.36 against 1.60 ms at B=8 T=4,096
  H=4 K=256 V=512 on an H100, every pass at 64: fwd+bwd slower)."""
  if dh and cfg.bv_dh is not None:
    return cfg.bv_dh
  if cfg.bv_state is not None:
    return cfg.bv_state
  if (K > 128 and not per_channel and not is_varlen
      and segments.bound_count() * B * H * (V // 32) < segments.sm_count()):
    return 16
  return 32


def state_stages(cfg: Config, K: int, per_channel: bool, dh: bool = False) -> int:
  """Pipeline stages of the state passes (`dh`: of the dh pass). Two stages of a per-channel pass's
  streamed [C, K] tiles (q, k, w and the float32 gates) need more shared memory than an H100 / H200
  block has (227 KiB) at K > 128: at K = 256 the state pass asked for 232 KiB, the dh pass 236 KiB;
  one stage needs 84 / 92 KiB. So does a scalar-gate pass holding one state block of more than 128
  key rows. In [64, BV] blocks (state_key_block's default above K = 128) two stages fit at K = 256,
  V = 512 (compiled for sm_90a, `gpu_aot`): the state pass in 112 KiB without spills; the dh pass,
  since its intra-chunk part moved to `chunk_dh.dv_local_pass`, in 136 KiB without spills at 16
  value columns (144 KiB and 132 bytes of spills a thread at 32; one stage: 36 KiB, none). Both
  passes pipeline their loads there (`stages_dh` sets the dh pass's apart). Timed on an H100, GDN
  fwd / fwd+bwd at H=4 K=256 V=512 bf16: the state passes at two stages against one everywhere,
  2.20 / 8.85 ms against 3.28 / 10.00 at B=1 T=32,768, 1.60 / 4.79 against 1.72 / 4.94 at B=8
  T=4,096; then the dh pass at two stages against one, fwd+bwd 5.88 against 7.72 ms at B=1
  T=32,768 (its 64 programs each walk 512 chunks, so a load it waits on is the whole pass's
  latency) and 4.37 against 4.49 at B=8 T=4,096."""
  if K > 128 and (per_channel or state_key_block(cfg, K, per_channel) > 128):
    return 1
  if dh and cfg.stages_dh is not None:
    return cfg.stages_dh
  return cfg.stages_state


def split_output(cfg: Config, K: int, per_channel: bool) -> bool:
  """Whether the forward computes o in a chunk-parallel kernel (common/gpu/chunk_o.py) after a state
  pass that writes the chunk-start states, rather than inside the state pass's serial chunk loop.
  That loop runs one program per value tile and head, few above K = 128 (B * H * V / BV = 64 at the
  475M model's B = 1, H = 4, V = 512), and q h and P v' lengthen each of its steps; a chunk-parallel
  output kernel runs a program per chunk. fla splits its forward so at K = 256 (chunk_fwd_h, then
  chunk_fwd_o), and in the 475M model's step on the H200 those two took 19.5 ms against our fused
  pass's 33.8. The cost is writing and reading h [B, NT, H, K, V] once.
  Per-channel gates (KDA) keep the fused pass: their output reads intra-chunk scores this kernel
  does not form."""
  if per_channel:
    return False
  if cfg.split_output is not None:
    return cfg.split_output
  return K > 128


def split_dv_local(cfg: Config, K: int) -> bool:
  """Whether the backward forms the intra-chunk part of dv', P^T do, in a chunk-parallel kernel
  (`chunk_dh.dv_local_pass`) before the dh pass, rather than inside the dh pass's serial chunk loop.
  That loop runs one program per value tile and head, and each forms the chunk's [C, C] scores, a
  K-long product, on its critical path: above K = 128 the split pays (GDN fwd+bwd at H=4 K=256
  V=512 on an H100: 7.82 against 8.43 ms at B=1 T=32,768, 4.55 against 4.74 at B=8 T=4,096, with
  the other kernel changes of that A/B); at K = V = 128, H = 16 the extra kernel and the round trip
  of P^T do through memory cost more than the products it saves (fwd+bwd at B=4 T=4,096: GDN 1.82
  against 1.66 ms, simple GLA 0.91 against 0.74)."""
  if cfg.split_dv_local is not None:
    return cfg.split_dv_local
  return K > 128
