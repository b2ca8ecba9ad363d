"""HGRN's elementwise recurrence as Pallas GPU kernels (Triton lowering), with a custom_vjp.

  h_t = exp(g_t) * h_{t-1} + x_t;  o_t = h_t        (elementwise over the width D, float32 state)

Memory-bound (a few flops per element): every kernel reads its inputs once, thousands of programs
fill the GPU, and every serial chain is short (README.md gives the bytes per phase). The width is cut into tiles of BD lanes, the time axis into chunks of C
tokens, and the forward runs three kernels:
  1. `_summary`  grid (D/BD, NT, B): each chunk from a zero state, keeping only its end: the affine map
                 S -> A S + b of the chunk, A = exp(sum g) and b = h_loc (the chunk-local state).
  2. `_carry`    grid (D/BD', B): the chunk loop, S <- A S + b, writing each chunk's start state
                 S_in [B, NT, D] (float32) and the final state; resets at sequence starts for varlen.
  3. `_forward`  grid (D/BD, NT, B): each chunk again from its true start state S_in, writing o.
The backward is the adjoint recurrence run in reverse with the same three kernels:
  lam_t = do_t + exp(g_{t+1}) lam_{t+1} (+ the final-state cotangent at a sequence's last token),
  dx_t = lam_t,  dg_t = lam_t exp(g_t) h_{t-1},  d initial_state = exp(g_0) lam_0,
carrying c = exp(g_t) lam_t between chunks (a chunk maps c_in -> exp(sum g) c_in + sum_s exp(G_s) do_s).
Residuals are o (h_{t-1} = o_{t-1}; the output is kept anyway) and S_in (h_{t-1} at chunk starts,
float32); nothing is recomputed.

Inside the chunk kernels a loop over groups of `rows` rows loads each group's rows (static offsets
from the group's start) before it scans them, so the loads of a group are in flight together; the
scan itself is a chain of C multiply-adds per lane, and every exp is of a single gate (<= 0) or of a gate sum (<= 0), so any gate
magnitude is exact. The carry kernel loads `unroll` chunks' rows at a time for the same reason.

A single chunk without cu_seqlens (decoding: T = 1 takes C = 1) skips kernels 1 and 2: the forward
kernel starts from the initial state and also writes the final state.

Supported: any B, T, D (D zero-padded to a multiple of the width tile, T to whole chunks or re-packed
chunk-aligned by common.varlen); x and g each in bf16, f16 or f32; initial_state, final state and
cu_seqlens.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common import varlen
from pallas_kernels.common.gpu.kernel_math import F32, store_at_flag
from pallas_kernels.common.gpu.layout import call, next_pow2, pad_axis, sds, spec_if

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


class Config(NamedTuple):
  """Tile sizes and launch parameters (`chunk_hgrn(..., config=...)`)."""
  chunk: int = 64        # tokens per chunk; shorter inputs take the power of two that covers them
  bd: int = 256          # width tile of the chunk kernels (2 lanes per thread at 4 warps)
  rows: int = 16         # rows of a chunk loaded together before they are scanned
  warps: int = 4
  bd_carry: int = 64     # width tile of the chunk loop: B * D / 64 programs
  unroll: int = 16       # chunks whose rows the chunk loop loads together
  warps_carry: int = 2


DEFAULT = Config()


class _Static(NamedTuple):
  C: int
  BD: int
  is_varlen: bool
  interpret: bool
  cfg: Config


def unsupported(x, g, *_, **__) -> str | None:
  """Why the GPU kernels cannot run these inputs (None when they can): the dispatch `supports` hook."""
  for name, a in (("x", x), ("g", g)):
    if a.dtype not in DTYPES:
      return f"`{name}` has dtype {a.dtype} (supported: bfloat16, float16, float32)"
  return None


def _call(kernel, grid, in_specs, out_specs, out_shape, st: _Static, warps, aliases=None):
  """layout.call with one pipeline stage (every kernel here streams its rows once)."""
  return call(kernel, grid, in_specs, out_specs, out_shape, interpret=st.interpret, warps=warps,
              stages=1, aliases=aliases)


def _scan_rows(C: int, rows: int, reverse: bool, group, carry):
  """Scans the C rows of a chunk in order (last first when `reverse`), `rows` at a time:
  carry = group(base, order, carry) handles rows base + j for j in `order`. The rows of a group are
  unrolled so that their loads are issued together (before any store of the group, which the loads
  could not pass); the groups run as a loop, which keeps the traced body and compile time small."""
  rows = min(rows, C)
  n = C // rows
  order = list(range(rows))[::-1] if reverse else list(range(rows))
  run = lambda i, carry: group((n - 1 - i if reverse else i) * rows, order, carry)
  return lax.fori_loop(0, n, run, carry) if n > 1 else run(0, carry)


def _load_rows(ref, base, order):
  return [ref[base + j, :].astype(F32) for j in order]


# --- chunk kernels: grid (D / BD, NT, B) ----------------------------------------------------------

def _chunk_specs(st: _Static):
  tok = pl.BlockSpec((None, st.C, st.BD), lambda j, n, b: (b, n, j))
  per_chunk = pl.BlockSpec((None, None, st.BD), lambda j, n, b: (b, n, j))
  return tok, per_chunk


def _summary_kernel(x_ref, g_ref, a_ref, b_ref, *, rows, reverse):
  """The chunk as an affine map of its carry: forward h = e h + x, reverse c = e (c + do)."""
  C, BD = x_ref.shape

  def group(base, order, carry):
    h, G = carry
    xs, gs = _load_rows(x_ref, base, order), _load_rows(g_ref, base, order)
    for x, g in zip(xs, gs):
      G += g
      h = jnp.exp(g) * (h + x) if reverse else jnp.exp(g) * h + x
    return h, G

  h, G = _scan_rows(C, rows, reverse, group, (jnp.zeros((BD,), F32), jnp.zeros((BD,), F32)))
  a_ref[...] = jnp.exp(G)
  b_ref[...] = h


def _summary(x, g, st: _Static, reverse: bool):
  """(A, b) [B, NT, D] float32 of every chunk: forward from x, reverse (the adjoint) from do."""
  B, T, D = x.shape
  NT = T // st.C
  tok, per_chunk = _chunk_specs(st)
  kern = functools.partial(_summary_kernel, rows=st.cfg.rows, reverse=reverse)
  return _call(kern, (D // st.BD, NT, B), [tok, tok], [per_chunk, per_chunk],
               [sds((B, NT, D), F32)] * 2, st, st.cfg.warps)(x, g)


def _forward_kernel(x_ref, g_ref, s_ref, o_ref, *last_ref, rows):
  """o of one chunk from its start state; with `last_ref`, also the state after the chunk."""

  def group(base, order, h):
    xs, gs = _load_rows(x_ref, base, order), _load_rows(g_ref, base, order)
    for j, x, g in zip(order, xs, gs):
      h = jnp.exp(g) * h + x
      o_ref[base + j, :] = h.astype(o_ref.dtype)
    return h

  h = _scan_rows(x_ref.shape[0], rows, False, group, s_ref[...])
  if last_ref:
    last_ref[0][...] = h


def _forward(x, g, S_in, st: _Static, want_last=False):
  """[o [B, T, D] in x.dtype] (and, want_last, the state after each chunk [B, NT, D])."""
  B, T, D = x.shape
  NT = T // st.C
  tok, per_chunk = _chunk_specs(st)
  kern = functools.partial(_forward_kernel, rows=st.cfg.rows)
  outs = [(tok, sds(x.shape, x.dtype))] + [(per_chunk, sds((B, NT, D), F32))] * want_last
  return _call(kern, (D // st.BD, NT, B), [tok, tok, per_chunk], [o[0] for o in outs],
               [o[1] for o in outs], st, st.cfg.warps)(x, g, S_in)


def _backward_kernel(do_ref, g_ref, o_ref, s_ref, c_ref, dx_ref, dg_ref, *, rows):
  """One chunk of the adjoint, last token first, from the carry c_in = exp(g) lam of the token after
  the chunk; h_{t-1} is o_{t-1}, or the start state S_in for the chunk's first token."""

  def h_prev(base, j):
    if j:
      return o_ref[base + j - 1, :].astype(F32)
    if isinstance(base, int) and base == 0:
      return s_ref[...]
    return jnp.where(base == 0, s_ref[...], o_ref[jnp.maximum(base - 1, 0), :].astype(F32))

  def group(base, order, c):
    dos, gs = _load_rows(do_ref, base, order), _load_rows(g_ref, base, order)
    hs = [h_prev(base, j) for j in order]
    for j, do, g, h in zip(order, dos, gs, hs):
      lam = do + c
      e = jnp.exp(g)
      dx_ref[base + j, :] = lam.astype(dx_ref.dtype)
      dg_ref[base + j, :] = (lam * e * h).astype(dg_ref.dtype)
      c = e * lam
    return c

  _scan_rows(do_ref.shape[0], rows, True, group, c_ref[...])


def _backward(do, g, o, S_in, C_in, st: _Static):
  """dx [B, T, D] in do's dtype, dg in g's dtype."""
  B, T, D = do.shape
  tok, per_chunk = _chunk_specs(st)
  kern = functools.partial(_backward_kernel, rows=st.cfg.rows)
  return _call(kern, (D // st.BD, T // st.C, B), [tok, tok, tok, per_chunk, per_chunk], [tok, tok],
               [sds(do.shape, do.dtype), sds(g.shape, g.dtype)], st, st.cfg.warps)(do, g, o, S_in, C_in)


# --- the chunk loop: grid (D / BD', B) ------------------------------------------------------------

def _carry_kernel(a_ref, b_ref, init_ref, reset_ref, record_ref, final0_ref, out_ref, final_ref, *,
                  NT, unroll, reverse):
  """carry <- A carry + b over the chunks (in reverse for the adjoint), writing the carry that enters
  each chunk. Without varlen (reset_ref, record_ref and final0_ref None) the carry starts from
  `init` and its last value is `final`; with varlen it is reset to init[s] at chunks flagged s >= 0
  in `reset` and stored to final[e] after chunks flagged e >= 0 in `record` (forward: starts / ends;
  adjoint: ends / starts). final0_ref is final's initial content (aliased to final_ref)."""
  del final0_ref
  is_varlen = reset_ref is not None
  chunk = (lambda i: NT - 1 - i) if reverse else (lambda i: i)

  def steps(i0, n, carry):
    cs = [chunk(i0 + j) for j in range(n)]
    As, bs = [a_ref[c, :] for c in cs], [b_ref[c, :] for c in cs]
    if is_varlen:  # the flags and initial states loaded with the rows, so a select, not a branch
      resets, records = [reset_ref[c] for c in cs], [record_ref[c] for c in cs]
      inits = [init_ref[jnp.maximum(s, 0), :] for s in resets]
    for j, c in enumerate(cs):
      if is_varlen:
        carry = jnp.where(resets[j] >= 0, inits[j], carry)
      out_ref[c, :] = carry
      carry = As[j] * carry + bs[j]
      if is_varlen:
        store_at_flag(records[j], functools.partial(_store_row, final_ref, carry))
    return carry

  carry = jnp.zeros(out_ref.shape[-1:], F32) if is_varlen else init_ref[...]
  n_blocks = NT // unroll
  if n_blocks:
    carry = lax.fori_loop(0, n_blocks, lambda i, carry: steps(i * unroll, unroll, carry), carry)
  carry = steps(n_blocks * unroll, NT % unroll, carry)
  if not is_varlen:
    final_ref[...] = carry


def _store_row(ref, row, i):
  ref[i, :] = row


def _carry(A, b, init, reset, record, st: _Static, reverse: bool):
  """Returns the carry entering every chunk [B, NT, D] and the final carries [N, D] (float32)."""
  B, NT, D = A.shape
  N = init.shape[0]
  BD = min(st.cfg.bd_carry, st.BD)
  rows = pl.BlockSpec((None, NT, BD), lambda j, b: (b, 0, j))
  if st.is_varlen:
    state = pl.BlockSpec((N, BD), lambda j, b: (0, j))
  else:
    state = pl.BlockSpec((None, BD), lambda j, b: (b, j))
  # varlen: sequences with no tokens pass `init` through (h0 -> final, dht -> dh0)
  flags = (reset, record, init) if st.is_varlen else (None, None, None)
  flag_spec = pl.BlockSpec((NT,), lambda j, b: (0,))
  in_specs = [rows, rows, state] + [spec_if(x, spec) for x, spec in zip(flags, [flag_spec] * 2
                                                                        + [state])]
  kern = functools.partial(_carry_kernel, NT=NT, unroll=st.cfg.unroll, reverse=reverse)
  return _call(kern, (D // BD, B), in_specs, [rows, state],
               [sds((B, NT, D), F32), sds(init.shape, F32)], st, st.cfg.warps_carry, {5: 1})(
                   A, b, init, *flags)


# --- custom_vjp on padded, chunk-aligned inputs ---------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _hgrn(st: _Static, x, g, h0, starts, ends):
  return _hgrn_fwd(st, x, g, h0, starts, ends)[0]


def _hgrn_fwd(st, x, g, h0, starts, ends):
  if not st.is_varlen and x.shape[1] == st.C:  # one chunk (decoding): no chunk loop
    S_in = h0[:, None]
    o, last = _forward(x, g, S_in, st, want_last=True)
    final = last[:, 0]
  else:
    A, b = _summary(x, g, st, reverse=False)
    S_in, final = _carry(A, b, h0, starts, ends, st, reverse=False)
    (o,) = _forward(x, g, S_in, st)
  return (o, final), (g, o, S_in, starts, ends)


def _hgrn_bwd(st, res, cts):
  g, o, S_in, starts, ends = res
  do, dht = cts
  do = do.astype(o.dtype)
  A, b = _summary(do, g, st, reverse=True)
  C_in, dh0 = _carry(A, b, dht.astype(F32), ends, starts, st, reverse=True)
  dx, dg = _backward(do, g, o, S_in, C_in, st)
  return dx, dg, dh0, None, None


_hgrn.defvjp(_hgrn_fwd, _hgrn_bwd)


def _chunk_size(T: int, n_seq: int, largest: int) -> int:
  """The configured chunk, or the power of two covering the mean sequence length when that is
  shorter (decoding: T = 1 takes C = 1), so short inputs are not padded to a whole chunk."""
  return min(largest, next_pow2(-(-T // n_seq), minimum=1))


def chunk_hgrn(x, g, *, initial_state, cu_seqlens=None, interpret=False,
               config: Config = DEFAULT):
  """x, g [B, T, D]. Returns (o [B, T, D] in x.dtype, final_state [N, D] float32), like xla.py."""
  reason = unsupported(x, g)
  if reason:
    raise ValueError(f"the Pallas GPU kernels cannot run these inputs: {reason}; use backend='xla'")
  B, T, D = x.shape
  C = _chunk_size(T, 1 if cu_seqlens is None else initial_state.shape[0], config.chunk)
  BD = min(config.bd, next_pow2(D))
  Dp = -(-D // BD) * BD

  # Pad (and for varlen re-pack chunk-aligned) with x = g = 0, which leaves the state unchanged.
  plan = varlen.chunk_plan(T, C, cu_seqlens)
  x, g = varlen.to_chunked(x, plan), varlen.to_chunked(g, plan)
  starts, ends = plan.segments or (None, None)
  x, g, h0 = pad_axis(x, 2, Dp), pad_axis(g, 2, Dp), pad_axis(initial_state, 1, Dp)
  st = _Static(C, BD, cu_seqlens is not None, bool(interpret), config)
  o, S = _hgrn(st, x, g, h0, starts, ends)
  return varlen.from_chunked(o[..., :D], plan), S[:, :D]


def fused_recurrent_hgrn(x, g, *, initial_state, cu_seqlens=None, interpret=False):
  """Token by token (decode): the same kernels; a single chunk (T = 1 takes C = 1) runs one kernel
  launch. Shapes as `chunk_hgrn`."""
  return chunk_hgrn(x, g, initial_state=initial_state, cu_seqlens=cu_seqlens, interpret=interpret)
