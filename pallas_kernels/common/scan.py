"""The sequential state pass every recurrence shares, with per-sequence resets for varlen."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.common.varlen import Segments

tree_map = jax.tree_util.tree_map


def scan_with_resets(step: Callable, state0, xs, segments: Segments | None = None):
  """Runs `state, y = step(state, x)` over the leading axis of `xs`; returns (final_state, ys).

  Without segments, `state0` is the carry itself (batched [B, ...]) and the final carry is returned.
  With segments (packed varlen, B == 1), `state0` holds one initial state per sequence ([N, ...]
  leaves): the carry is reset to `state0[n]` where sequence n starts and copied out where it ends,
  and the per-sequence final states ([N, ...], `state0[n]` for an empty sequence) are returned.
  """
  if segments is None:
    return lax.scan(step, state0, xs)

  def reset_step(carry, inputs):
    state, finals = carry
    x, start, end = inputs
    s, e = jnp.maximum(start, 0), jnp.maximum(end, 0)
    state = tree_map(lambda cur, h0: jnp.where(start >= 0, h0[s][None], cur), state, state0)
    state, y = step(state, x)
    finals = tree_map(lambda f, cur: f.at[e].set(jnp.where(end >= 0, cur[0], f[e])), finals, state)
    return (state, finals), y

  carry0 = (tree_map(lambda h0: jnp.zeros_like(h0[:1]), state0), state0)
  (_, finals), ys = lax.scan(reset_step, carry0, (xs, segments.starts, segments.ends))
  return finals, ys
