"""The two sequential passes of chunked GLA with a per-channel decay, as Pallas GPU kernels (Triton
lowering): the forward state pass (with the output) and the reverse state-gradient (dh) pass.

Both run on grid (V / BV, B * H): one program per value tile and head walks the NT chunks
(`lax.fori_loop`) with a float32 [K, BV] state in registers. The value tile is the first grid axis,
which Triton launches fastest, so the programs of one head run side by side and share its keys and
gates through L2. The chunk-parallel kernel before them (gpu.py) has already formed every per-channel
decay, so each step is two or three dots and a row scaling (G_C: the chunk's last row of the float32
chunk-local gate cumsum G):

  state pass   h[c] = S (only when the backward needs it);  o = qd S + A v;
               S <- diag(exp(G_C)) S + kd^T v
  dh pass      dh[c] = dS (the gradient of the state at the chunk's end);
               dv = A^T do + kd dS;  dS <- diag(exp(G_C)) dS + qd^T do

with qd = scale q exp(Gq) and kd = k exp(G_C - G) (input dtype, every factor <= 1) and A the
intra-chunk score matrix (scale included). Gq is the query side's cumsum: G for GLA, G - g for RWKV-6
(it reads the state before its token).

Nothing here knows about GLA beyond those formulas: KDA and RWKV-6 walk their states the same way.
Varlen inputs are re-packed chunk-aligned (`common.varlen`); per-chunk flags say where a sequence
starts (reset to its initial state) and ends (write its final state).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.common.cost import kernel_cost
from pallas_kernels.common.gpu.kernel_math import F32, dot, dot_tn, precision
from pallas_kernels.common.gpu.layout import Specs, compiler_params

CHUNK = 64


def call(kernel, grid, in_specs, out_specs, out_shape, *, interpret, warps, stages, aliases=None,
         loop_trips=None):
  """pallas_call with the Triton compiler parameters of this package (and its cost estimate;
  `loop_trips`: see `kernel_cost`)."""
  call = functools.partial(pl.pallas_call, kernel, grid=grid, in_specs=in_specs,
                           out_specs=out_specs, out_shape=out_shape,
                           input_output_aliases=aliases or {},
                           compiler_params=compiler_params(warps, stages), interpret=interpret)
  return lambda *args: call(cost_estimate=kernel_cost(call(), *args, loop_trips=loop_trips))(*args)


def sds(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


# --- the chunk walk both passes share -------------------------------------------------------------

def _walk(step, NT, *, reverse, init_ref, out_ref, reset_ref=None, finish_ref=None):
  """S = step(c, S) over the NT chunks (last to first if `reverse`), S float32 in registers.

  Without flags S starts from init_ref and out_ref gets the last S. With the varlen flags (int32
  [NT]: the sequence whose walk begins / finishes at chunk c, else -1) S is reset to init_ref[n]
  where sequence n begins and copied to out_ref[n] where it finishes.
  """
  varlen_ = reset_ref is not None

  def body(i, S):
    c = NT - 1 - i if reverse else i
    if varlen_:
      n = reset_ref[c]
      S = lax.cond(n >= 0, lambda: init_ref[jnp.maximum(n, 0)].astype(F32), lambda: S)
    S = step(c, S)
    if varlen_:
      n = finish_ref[c]

      @pl.when(n >= 0)
      def _():
        out_ref[jnp.maximum(n, 0)] = S
    return S

  S0 = jnp.zeros(init_ref.shape[-2:], F32) if varlen_ else init_ref[...].astype(F32)
  S = lax.fori_loop(0, NT, body, S0)
  if not varlen_:
    out_ref[...] = S


def _launch(kernel, args, in_specs, boundary, out_specs, out_shape, boundary_out, sp, starts, ends,
            *, varlen_, interpret, bv, warps, stages):
  """Runs a pass on grid (V / BV, B * H). `boundary` [N, H, K, V] float32 (h0, or the final-state
  gradient) is appended to the inputs; with varlen also the chunk flags (starts, ends) and the
  boundary again, aliased to output `boundary_out`, so sequences with no tokens pass it through."""
  B, K, V = args[0].shape[0], boundary.shape[2], boundary.shape[3]
  spec = sp.seq_h0(K, bv, boundary.shape[0] if varlen_ else None)
  args, in_specs, aliases = args + [boundary], in_specs + [spec], None
  if varlen_:
    args += [starts, ends, boundary]
    in_specs += [sp.seq_flags()] * 2 + [spec]
    aliases = {len(args) - 1: boundary_out}
  out_specs = list(out_specs)
  out_specs.insert(boundary_out, spec)
  out_shape = list(out_shape)
  out_shape.insert(boundary_out, sds(boundary.shape, F32))
  return call(kernel, (V // bv, B * sp.H), in_specs, out_specs, out_shape, interpret=interpret,
              warps=warps, stages=stages, aliases=aliases)(*args)


def _boundary_refs(refs, n_in, varlen_):
  """Splits a pass kernel's refs: (inputs, boundary, start flags, end flags, outputs)."""
  refs = list(refs)
  flags = refs[n_in + 1:n_in + 3] if varlen_ else [None, None]
  outs = refs[n_in + 4:] if varlen_ else refs[n_in + 1:]
  return refs[:n_in], refs[n_in], flags[0], flags[1], outs


# --- forward state pass ---------------------------------------------------------------------------

def _state_kernel(*refs, NT, varlen_, want_h):
  (qd_ref, kd_ref, v_ref, a_ref, g_ref), h0_ref, st_ref, en_ref, outs = _boundary_refs(
      refs, 5, varlen_)
  o_ref, fin_ref, h_ref = outs if want_h else (*outs, None)
  C = CHUNK
  dt = kd_ref.dtype
  prec = precision(dt)

  def step(c, S):
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    if want_h:
      h_ref[c] = S.astype(h_ref.dtype)
    v = v_ref[sl, :]
    o = dot(qd_ref[sl, :], S.astype(dt), prec) + dot(a_ref[sl, :], v, prec)
    o_ref[sl, :] = o.astype(o_ref.dtype)
    return S * jnp.exp(g_ref[t0 + C - 1, :])[:, None] + dot_tn(kd_ref[sl, :], v, prec)

  _walk(step, NT, reverse=False, init_ref=h0_ref, out_ref=fin_ref, reset_ref=st_ref,
        finish_ref=en_ref)


def state_pass(qd, kd, v, A, G, h0, starts, ends, *, want_h, varlen_, interpret, bv=32, warps=4,
               stages=2):
  """qd, kd [B, T, H, K] (the decayed queries and keys), v [B, T, H, V], A [B, T, H, C] (input
  dtype), G [B, T, H, K] float32, h0 [N, H, K, V] float32. Returns o [B, T, H, V] (input dtype),
  the final states [N, H, K, V] (float32) and, with want_h, the chunk-start states h
  [B, NT, H, K, V] (input dtype; else None). starts / ends: int32 [NT] per-chunk sequence flags
  (varlen)."""
  B, T, H, K = kd.shape
  V = v.shape[-1]
  BV = min(bv, V)
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_state_kernel, NT=sp.NT, varlen_=varlen_, want_h=want_h)
  out_specs = [sp.seq_tok(BV, True)] + [sp.seq_state(K, BV)] * want_h
  out_shape = [sds(v.shape, kd.dtype)] + [sds((B, sp.NT, H, K, V), kd.dtype)] * want_h
  o, fin, *h = _launch(kern, [qd, kd, v, A, G],
                       [sp.seq_tok(K), sp.seq_tok(K), sp.seq_tok(BV, True), sp.seq_tok(CHUNK),
                        sp.seq_tok(K)], h0, out_specs, out_shape, 1, sp, starts, ends,
                       varlen_=varlen_, interpret=interpret, bv=BV, warps=warps, stages=stages)
  return o, fin, (h[0] if want_h else None)


# --- reverse state-gradient pass ------------------------------------------------------------------

def _dh_kernel(*refs, NT, varlen_):
  (qd_ref, kd_ref, a_ref, do_ref, g_ref), dht_ref, st_ref, en_ref, (dh_ref, dv_ref, dh0_ref) = (
      _boundary_refs(refs, 5, varlen_))
  C = CHUNK
  dt = kd_ref.dtype
  prec = precision(dt)

  def step(c, dS):
    t0 = pl.multiple_of(c * C, C)
    sl = pl.ds(t0, C)
    dh_ref[c] = dS.astype(dh_ref.dtype)
    do = do_ref[sl, :]
    dv = dot_tn(a_ref[sl, :], do, prec) + dot(kd_ref[sl, :], dS.astype(dt), prec)
    dv_ref[sl, :] = dv.astype(dv_ref.dtype)
    return dS * jnp.exp(g_ref[t0 + C - 1, :])[:, None] + dot_tn(qd_ref[sl, :], do, prec)

  # Walking backwards, a sequence begins at its last chunk and finishes at its first.
  _walk(step, NT, reverse=True, init_ref=dht_ref, out_ref=dh0_ref, reset_ref=en_ref,
        finish_ref=st_ref)


def dh_pass(qd, kd, A, do, G, dht, starts, ends, *, varlen_, interpret, bv=32, warps=4, stages=2):
  """qd, kd [B, T, H, K], A [B, T, H, C] as for `state_pass`; do [B, T, H, V]; G float32; dht
  [N, H, K, V] float32. Returns dh [B, NT, H, K, V] and dv [B, T, H, V] (input dtype) and
  d initial_state [N, H, K, V] (float32)."""
  B, T, H, K = kd.shape
  V = do.shape[-1]
  BV = min(bv, V)
  sp = Specs(H, CHUNK, T)
  kern = functools.partial(_dh_kernel, NT=sp.NT, varlen_=varlen_)
  return _launch(kern, [qd, kd, A, do, G],
                 [sp.seq_tok(K), sp.seq_tok(K), sp.seq_tok(CHUNK), sp.seq_tok(BV, True),
                  sp.seq_tok(K)],
                 dht, [sp.seq_state(K, BV), sp.seq_tok(BV, True)],
                 [sds((B, sp.NT, H, K, V), kd.dtype), sds(do.shape, kd.dtype)], 2, sp, starts, ends,
                 varlen_=varlen_, interpret=interpret, bv=BV, warps=warps, stages=stages)
