"""Segment parallelism: one op on one device, each sequence's time axis split into S contiguous
segments whose state passes run side by side.

A chunked op walks its T / 64 chunks one after another, parallel only over B x H (x value blocks).
At B = 1 and long T that is a few dozen programs on a GPU of 132 SMs, each walking hundreds of
chunks. Every family's state update is affine in the state, so the segments can run at once from
a zero state and be joined afterwards: exactly what context parallelism does across devices
(`common.context`: each slice's transition A and final state B, folded in order, then each slice's
outputs corrected by the state that entered it). Here the S segments are a `jax.vmap` axis bound
under `AXIS`, so `context.run` sees them as the devices of a context axis, and the batching rule of
`pallas_call` turns the vmap into one more grid dimension: the kernels launch S times the
programs. What it costs is context parallelism's: the transition (a decay; for the delta rules K
extra value columns in the same op call) and a correction of each segment's outputs (mLSTM runs
again from the entering state); the fold is S steps of [H, K, K] or [H, K] maps.

Off unless asked for: in the 475M GDN's train step at B=1 T=32,768 (H=4, K=256, V=512) on an H100,
4 segments ran at 0.98x the whole op and 16 needed more memory than the GPU has, so the automatic
choice has no measured shape where it wins yet. `with segment_parallel(4): ...` runs every chunked
op traced inside on 4 segments (T must divide), `with segment_parallel("auto"): ...` lets
`choose_segments` pick S from B, H, T and the device's SM count. Ops without a transition (a
per-value-channel gate `gv`), decode ops and `reverse` run whole.
"""
from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

from pallas_kernels.common import context

AXIS = "segments"
MIN_SEGMENT = 1024    # tokens: below 16 chunks a segment's fold and correction stop paying off
MAX_SEGMENTS = 16


_REQUESTED = contextvars.ContextVar("segment_parallel", default=None)


@contextlib.contextmanager
def segment_parallel(segments):
  """Chunked ops traced inside run on `segments` segments (an int; 1: whole) or on
  `choose_segments`' count ("auto")."""
  if segments != "auto":
    check_segments(segments, None)
  token = _REQUESTED.set(segments)
  try:
    yield
  finally:
    _REQUESTED.reset(token)


def count(kind: str, B: int, T: int, H: int | None, transition) -> int:
  """The segments a `kind` op of these sizes runs on under the current `segment_parallel`."""
  requested = _REQUESTED.get()
  if requested is None or kind != "chunk" or transition is None:
    return 1
  if requested == "auto":
    return choose_segments(B, T, H or 1)
  return check_segments(requested, T)


def is_time_major(x) -> bool:
  """An input laid out [B, T, ...] (q, k, v, gates, beta), as opposed to a per-head parameter
  (RWKV-6's u [H, K], simple GLA's g_gamma [H]): every [B, T, ...] input of an op has three or
  more axes, every per-head one fewer."""
  return x is not None and x.ndim >= 3


def sm_count(default: int = 132) -> int:
  """The streaming multiprocessors of the first device (`core_count` on GPUs), or `default`."""
  return getattr(jax.devices()[0], "core_count", None) or default


def bound_count() -> int:
  """The segments of the op being traced: the size of the segments' vmap axis inside `run`, else
  1."""
  try:
    return jax.lax.axis_size(AXIS)
  except NameError:
    return 1


def choose_segments(B: int, T: int, H: int, sms: int | None = None) -> int:
  """The segment count for a [B, T, H, ...] op: the largest power of two S <= MAX_SEGMENTS with
  B x H x S programs at most two waves of the SMs, segments of at least MIN_SEGMENT tokens and T
  divisible by 64 S (whole chunks); 1 when B x H already fills the device."""
  sms = sms or sm_count()
  S = 1
  while (2 * S <= MAX_SEGMENTS and B * H * 2 * S <= 2 * sms and T // (2 * S) >= MIN_SEGMENT
         and T % (128 * S) == 0):
    S *= 2
  return S


def check_segments(segments: int, T: int | None) -> int:
  """`segments` if it is a positive int that divides T (T None: any)."""
  if not isinstance(segments, int) or isinstance(segments, bool) or segments < 1:
    raise ValueError(f"`segments` must be a positive int (1: off) or 'auto'; got {segments!r}")
  if T is not None and T % segments:
    raise ValueError(f"`segments={segments}` must divide the sequence length T = {T}")
  return segments


def split(x, S: int):
  """[B, T, ...] -> [S, B, T / S, ...]."""
  return jnp.moveaxis(x.reshape(x.shape[0], S, x.shape[1] // S, *x.shape[2:]), 1, 0)


def join(x):
  """[S, B, T / S, ...] -> [B, T, ...]."""
  return jnp.moveaxis(x, 0, 1).reshape(x.shape[1], x.shape[0] * x.shape[2], *x.shape[3:])


def run(transition: context.Transition, call, args: tuple, initial_state, cu_seqlens, segments: int,
        *, output_final_state: bool, scale=None):
  """The op over `segments` segments of T (see the module docstring); the arguments are those of
  `context.run`, with whole [B, T, ...] inputs. Returns (o [B, T, ...], final state or None)."""
  time_major = tuple(is_time_major(a) for a in args)
  pieces = tuple(split(a, segments) if t else a for a, t in zip(args, time_major))

  def segment(pieces):
    return context.run(transition, call, pieces, initial_state, cu_seqlens, AXIS,
                       output_final_state=output_final_state, scale=scale)
  o, final = jax.vmap(segment, in_axes=(tuple(0 if t else None for t in time_major),),
                      axis_name=AXIS)(pieces)
  # context.run returns the same final state on every segment
  return join(o), None if final is None else jax.tree_util.tree_map(lambda s: s[0], final)
