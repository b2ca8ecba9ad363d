"""Chunked GLA with a per-channel decay as Pallas GPU kernels (Triton lowering), with a custom_vjp.

The math is xla.py's chunked form (README.md). G is the chunk-local gate cumsum [C, K] (float32), G_C
its last row, Gq the query side's (G for GLA; G - g for RWKV-6, which reads the state before its
token), C = 64. The per-channel decays are formed once, by chunk-parallel kernels, so the two
sequential passes (common/gpu's chunk_state and chunk_dh, per-channel gates with the scores given)
are a few dots per chunk, as for a scalar gate:

forward
  1. `layout.gate_cumsum` grid (NT, B*H): G (written once; every later kernel reads it).
  2. `_intra`       grid (NT, B*H): the intra-chunk scores A (scale included, input dtype), and the
                    decayed queries and keys qd = scale q exp(Gq), kd = k exp(G_C - G).
  3. `chunk_state.state_pass` grid (V/BV, B*H): o = qd h + A v, the chunk-start states h (input
                    dtype, kept for the backward; not written by a forward that is not
                    differentiated), final state.
backward (residuals: the inputs, G, A, qd, kd and h)
  4. `chunk_dh.dh_pass` grid (V/BV, B*H), chunks in reverse: dh (the state gradient at each chunk
                    end), d initial_state and dv = A^T do + kd dh (A^T do in a chunk-parallel
                    kernel before it above K = 128).
  5. `_dqkg`        grid (K/BK, NT, B*H): dA = scale do v^T, dq and dk (state parts plus the
                    intra-chunk parts) and dg, the reverse chunk-local cumsum of dG = q dq - k dk plus
                    the decay's gradient at the chunk end, sum_v dh (exp(G_C) h + kd^T v), which
                    reaches every row.

The intra-chunk pairs i > j are taken by levels (common/gpu/levels.py): each level factors
exp(Gq_i - G_j) through a reference row of its group, both exponents <= 0 (no positive cumulated
gate is exponentiated), so a level is one exp over [C, K] and one [C, C] dot per product, masked to
its groups; the diagonal (exp(0) = 1, or the bonus u for RWKV-6) is a row sum. The per-channel
products are exact per key tile, so dg needs no sum over tiles. Tile axes come first in the grids:
Triton launches axis 0 fastest, so programs that read the same head and chunk run side by side and
share their inputs through L2.

Supported: any B, T, H; K and V up to 256 (zero-padded to powers of two >= 16 outside the kernels,
by common/gpu/layout.py's `run_chunked`); bf16, f16 and f32; initial_state, final state, cu_seqlens
(re-packed chunk-aligned by common.varlen). Matmul operands are in the input dtype with a float32
accumulator; the state, the gates and the accumulators are float32.
`fused_recurrent_gla` is common/gpu/fused_recurrent.py's decode kernel with the per-channel gate.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.common.gpu import chunk_dh, chunk_state, config as shared_config
from pallas_kernels.common.gpu.config import CHUNK, Static
from pallas_kernels.common.gpu.fused_recurrent import fused_recurrent
from pallas_kernels.common.gpu.kernel_math import F32, dot, dot_nt, dot_tn, precision
from pallas_kernels.common.gpu.layout import (DTYPES, MAX_DIM, Specs, gate_cumsum, launch,
                                              run_chunked, sds)
from pallas_kernels.common.gpu.levels import (LEVELS, diagonal, level_decay, reference_rows,
                                              same_group)
from pallas_kernels.gla import reference


class Config(NamedTuple):
  """Tile sizes and launch parameters: the shared state passes' (`shared`: bv_state, warps_state,
  stages_state, bk_state; stages_chunk, which GLA's chunk kernels take too) and GLA's own
  kernels'."""
  shared: shared_config.Config = shared_config.DEFAULT
  bk_intra: int = 128     # key slice the intra kernel loops over (registers, not the grid)
  warps_intra: int = 8
  bk_dqkg: int = 32       # key tile (grid axis) of the dq/dk/dg kernel
  warps_dqkg: int = 4


DEFAULT = Config()


def unsupported(q, k, v, g=None, *_, **__) -> str | None:
  """Why the GPU kernels cannot run these inputs (None when they can): dispatch's `supports` hook."""
  K, V = q.shape[-1], v.shape[-1]
  if g is not None and g.ndim != 4:
    return f"gates of shape {g.shape} (the GLA kernels take per-channel gates [B, T, H, K])"
  if K > MAX_DIM or V > MAX_DIM:
    return f"head dims K={K}, V={V} (at most {MAX_DIM})"
  if q.dtype not in DTYPES:
    return f"dtype {q.dtype} (supported: bfloat16, float16, float32)"
  return None


# --- the intra-chunk levels -----------------------------------------------------------------------

def _level_factors(g_ref, cols, s, G, Gq):
  """Level s's decays [C, BK] split by side (`levels.level_decay`): exp(Gq_i - G_e) on the rows of
  upper halves (0 elsewhere) and exp(G_e - G_j) on the rows of lower halves (0 elsewhere)."""
  E, upper = level_decay(G, reference_rows(g_ref, cols, s), s, Gq)
  return jnp.where(upper, E, 0.0), jnp.where(upper, 0.0, E)


# --- 2. forward: intra-chunk scores and the decayed queries and keys ------------------------------

def _intra_kernel(*refs, scale, exclusive, bk):
  """One chunk and head, looping over key slices of bk channels: qd and kd are written slice by
  slice, A accumulates every level's masked dot (qf q)(kf k)^T and the diagonal."""
  q_ref, k_ref, g_ref = refs[:3]
  graw_ref, u_ref = refs[3:5] if exclusive else (None, None)
  a_ref, qd_ref, kd_ref = refs[-3:]
  C, K = k_ref.shape
  dt = q_ref.dtype
  prec = precision(dt)
  A = jnp.zeros((C, C), F32)
  diag = jnp.zeros((C,), F32)
  for k0 in range(0, K, bk):
    cols = pl.ds(k0, bk)
    q, k, G = q_ref[:, cols].astype(F32), k_ref[:, cols].astype(F32), g_ref[:, cols]
    Gq = G - graw_ref[:, cols] if exclusive else G
    qd_ref[:, cols] = (q * (jnp.exp(Gq) * scale)).astype(dt)
    kd_ref[:, cols] = (k * jnp.exp(g_ref[C - 1, cols][None, :] - G)).astype(dt)
    diag += jnp.sum(q * (k * u_ref[cols][None, :] if exclusive else k), axis=1)
    for s in LEVELS:
      qf, kf = _level_factors(g_ref, cols, s, G, Gq)
      A += same_group(s, dot_nt((q * qf).astype(dt), (k * kf).astype(dt), prec))
  a_ref[...] = (jnp.where(diagonal(), diag[:, None], A) * scale).astype(a_ref.dtype)


def _intra(q, k, G, g, u, st: Static):
  """Returns A [B, T, H, C] (row t: token t's scores over its chunk), qd and kd [B, T, H, K], all in
  the input dtype. With the bonus u (RWKV-6) the exclusive mode: o_t reads S_{t-1} (Gq = G - g,
  strict intra-chunk mask)."""
  B, T, H, K = q.shape
  sp = Specs(H, CHUNK, T)
  exclusive = u is not None
  args, specs = [q, k, G], [sp.chunk_tok(K)] * 3
  if exclusive:
    args += [g, u]
    specs += [sp.chunk_tok(K), pl.BlockSpec((None, K), lambda n, bh: (bh % H, 0))]
  kern = functools.partial(_intra_kernel, scale=st.scale, exclusive=exclusive,
                           bk=min(st.family_cfg.bk_intra, K))
  return launch(kern, (sp.NT, B * H), specs,
                [sp.chunk_tok(CHUNK), sp.chunk_tok(K), sp.chunk_tok(K)],
                [sds((B, T, H, CHUNK), q.dtype), sds(q.shape, q.dtype), sds(q.shape, q.dtype)],
                st, st.family_cfg.warps_intra, st.cfg.stages_chunk)(*args)


# --- 5. backward: dq, dk, dg ----------------------------------------------------------------------

def _dqkg_kernel(*refs, scale, exclusive):
  """One chunk, head and key tile (q, k, G, kd, h, dh hold that tile of the key axis; v, do all of
  V). The parts that read the states come first, so that only the chunk's tiles stay live through
  the levels."""
  q_ref, k_ref, g_ref = refs[:3]
  graw_ref, u_ref = refs[3:5] if exclusive else (None, None)
  kd_ref, v_ref, do_ref, h_ref, dh_ref, dq_ref, dk_ref, dg_ref = refs[5:13] if exclusive else (
      refs[3:11])
  du_ref = refs[13] if exclusive else None
  C, BK = k_ref.shape
  dt = q_ref.dtype
  prec = precision(dt)
  G = g_ref[...]
  Gq = G - graw_ref[...] if exclusive else G
  g_last = g_ref[C - 1, :]
  do, v, h, dh = do_ref[...], v_ref[...], h_ref[...], dh_ref[...]
  # The gradient of G_C through the state update, sum_v dh * S_end: in every row's dg.
  S_end = h.astype(F32) * jnp.exp(g_last)[:, None] + dot_tn(kd_ref[...], v, prec)
  later = jnp.sum(S_end * dh.astype(F32), axis=1)[None, :]
  dq = dot_nt(do, h, prec) * (jnp.exp(Gq) * scale)             # state parts
  dk = dot_nt(v, dh, prec) * jnp.exp(g_last[None, :] - G)
  dA = dot_nt(do, v, prec) * scale                            # dA_ij = scale do_i . v_j
  q, k = q_ref[...].astype(F32), k_ref[...].astype(F32)
  cols = pl.ds(0, BK)
  for s in LEVELS:
    qf, kf = _level_factors(g_ref, cols, s, G, Gq)
    dA_s = same_group(s, dA).astype(dt)
    dq += qf * dot(dA_s, (k * kf).astype(dt), prec)
    dk += kf * dot_tn(dA_s, (q * qf).astype(dt), prec)
  dA_ii = jnp.sum(jnp.where(diagonal(), dA, 0.0), axis=1)[:, None]
  if exclusive:  # the diagonal is the bonus scale q_i . (u k_i)
    u = u_ref[...][None, :]
    dq += dA_ii * u * k
    dk += dA_ii * u * q
  else:
    dq += dA_ii * k
    dk += dA_ii * q
  dq_ref[...] = dq.astype(dq_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dGq = q * dq
  dG = dGq - k * dk                                           # (the bonus's terms cancel here)
  dg = later + jnp.sum(dG, axis=0)[None, :] - jnp.cumsum(dG, axis=0) + dG   # rows >= t
  if exclusive:  # Gq = G - g: the decays' share of q dq reaches g directly, negated
    bonus = dA_ii * q * k                                     # dA_ii q_i k_i: du's terms
    dg -= dGq - u * bonus
    du_ref[...] = jnp.sum(bonus, axis=0)
  dg_ref[...] = dg


def _dqkg(q, k, v, G, g, u, kd, do, h, dh, st: Static):
  """Returns dq, dk (input dtype), dg [B, T, H, K] (float32, the raw gate's gradient) and, for
  RWKV-6 (the bonus u given), du [H, K] (float32)."""
  B, T, H, K = q.shape
  V = v.shape[-1]
  BK = min(st.family_cfg.bk_dqkg, K)
  exclusive = u is not None
  C = CHUNK
  tile = pl.BlockSpec((None, C, None, BK), lambda ik, n, bh: (bh // H, n, bh % H, ik))
  full = pl.BlockSpec((None, C, None, V), lambda ik, n, bh: (bh // H, n, bh % H, 0))
  state = pl.BlockSpec((None, None, None, BK, V), lambda ik, n, bh: (bh // H, n, bh % H, ik, 0))
  args, specs = [q, k, G], [tile] * 3
  outs, out_specs = [sds(q.shape, q.dtype), sds(q.shape, q.dtype), sds(q.shape, F32)], [tile] * 3
  if exclusive:
    args += [g, u]
    specs += [tile, pl.BlockSpec((None, BK), lambda ik, n, bh: (bh % H, ik))]
    outs.append(sds((B, T // C, H, K), F32))   # du per chunk, summed below
    out_specs.append(pl.BlockSpec((None, None, None, BK),
                                  lambda ik, n, bh: (bh // H, n, bh % H, ik)))
  kern = functools.partial(_dqkg_kernel, scale=st.scale, exclusive=exclusive)
  dq, dk, dg, *du = launch(kern, (K // BK, T // C, B * H), specs + [tile, full, full, state, state],
                           out_specs, outs, st, st.family_cfg.warps_dqkg, st.cfg.stages_chunk)(
                               *args, kd, v, do, h, dh)
  return dq, dk, dg, (jnp.sum(du[0], axis=(0, 1)) if du else None)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

def _forward(st: Static, q, k, v, g, u, h0, starts, ends, *, want_h):
  """(o, final state, residuals G, A, qd, kd, h); h is None unless want_h."""
  G = gate_cumsum(g, st, st.family_cfg.warps_intra)
  A, qd, kd = _intra(q, k, G, g, u, st)
  o, ht, kept = chunk_state.state_pass(qd, kd, None, v, G, h0, starts, ends, st, want_o=True,
                                       scores=A, keep_h=want_h)
  return o, ht, (G, A, qd, kd, kept[0] if want_h else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gla(st: Static, q, k, v, g, u, h0, starts, ends):
  """(o, final state) of padded inputs; g [B, T, H, K] float32, u None or [H, K]
  (layout.run_chunked's `core`)."""
  o, ht, _ = _forward(st, q, k, v, g, u, h0, starts, ends, want_h=False)
  return o, ht


def _gla_fwd(st, q, k, v, g, u, h0, starts, ends):
  o, ht, saved = _forward(st, q, k, v, g, u, h0, starts, ends, want_h=True)
  return (o, ht), (q, k, v, g, u, *saved, starts, ends)


def _gla_bwd(st, res, cts):
  q, k, v, g, u, G, A, qd, kd, h, starts, ends = res
  do, dht = cts
  do = do.astype(q.dtype)
  dh, dv, dh0 = chunk_dh.dh_pass(qd, kd, None, do, G, dht.astype(F32), starts, ends, st, scores=A)
  dq, dk, dg, du = _dqkg(q, k, v, G, g, u, kd, do, h, dh, st)
  return dq, dk, dv, dg, du, dh0, None, None


_gla.defvjp(_gla_fwd, _gla_bwd)


def run_chunk(q, k, v, g, u=None, *, scale, initial_state, cu_seqlens=None, interpret=False,
              config: Config = DEFAULT):
  """The kernels' entry for GLA and, with the bonus u [H, K], RWKV-6 (o_t reads S_{t-1}): the
  custom_vjp kernels through common/gpu/layout.py's `run_chunked` (padding, varlen re-packing).
  Shapes as `chunk_gla`."""
  return run_chunked(_gla, q, k, v, (g,), (u,), scale=scale, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, interpret=interpret, config=config.shared,
                     family_config=config, check=unsupported)


def chunk_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, interpret=False,
              config: Config = DEFAULT):
  """q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] log decays.

  Returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), like xla.py.
  """
  return run_chunk(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   interpret=interpret, config=config)


def _reference(q, k, v, g, beta, *, scale, initial_state, cu_seqlens, u=None):
  """The float32 recurrence behind the decode kernel's gradient (no beta: GLA has no delta rule)."""
  del beta
  return reference.fused_recurrent_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                                       cu_seqlens=cu_seqlens, u=u)


def recurrent(q, k, v, g, u=None, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """GLA (or with u, RWKV-6) token by token. Shapes as `fused_recurrent_gla`; u [H, K]."""
  return fused_recurrent(q, k, v, g, None, scale=scale, initial_state=initial_state,
                         cu_seqlens=cu_seqlens, interpret=interpret, u=u, reference=_reference)


def fused_recurrent_gla(q, k, v, g, *, scale, initial_state, cu_seqlens=None, interpret=False):
  """Token by token (decode): one launch reads each state once and writes it once. Shapes as
  `chunk_gla`."""
  return recurrent(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   interpret=interpret)
