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
    return checkpointed_scan(step, state0, xs)

  def reset_step(carry, inputs):
    state, finals = carry
    x, start, end = inputs
    s, e = jnp.maximum(start, 0), jnp.maximum(end, 0)
    state = tree_map(lambda cur, h0: jnp.where(start >= 0, h0[s][None], cur), state, state0)
    state, y = step(state, x)
    finals = tree_map(lambda f, cur: f.at[e].set(jnp.where(end >= 0, cur[0], f[e])), finals, state)
    return (state, finals), y

  carry0 = (tree_map(lambda h0: jnp.zeros_like(h0[:1]), state0), state0)
  (_, finals), ys = checkpointed_scan(reset_step, carry0, (xs, segments.starts, segments.ends))
  return finals, ys


# Above this many bytes of carries over the whole sequence (what a plain scan's backward keeps),
# `checkpointed_scan` keeps only every block's.
MAX_KEPT_CARRY_BYTES = 1 << 28


def checkpointed_scan(step: Callable, carry, xs, block: int | None = None):
  """`lax.scan(step, carry, xs)` whose gradient keeps the carry at every `block`-th step (default
  about sqrt(T), when the T carries exceed MAX_KEPT_CARRY_BYTES; else a plain scan) and recomputes
  the steps between, one block at a time. A recurrence's carry is its state, so a plain scan's
  backward holds T states and each step's intermediates: 8 GiB for a float32 gated delta rule at
  T=2048, H=2, K=256, V=512, more than a `gpu` test worker's share of the device. Same values and
  gradients; the steps run once more in the backward."""
  T = jax.tree_util.tree_leaves(xs)[0].shape[0]
  if block is None:
    carry_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(carry))
    if T * carry_bytes <= MAX_KEPT_CARRY_BYTES:
      return lax.scan(step, carry, xs)
    block = max(1, int(T ** 0.5))
  n = T // block
  if n <= 1:
    return lax.scan(step, carry, xs)
  head = tree_map(lambda x: x[:n * block].reshape(n, block, *x.shape[1:]), xs)

  @jax.checkpoint
  def run_block(carry, x_block):
    return lax.scan(step, carry, x_block)

  carry, ys = lax.scan(run_block, carry, head)
  ys = tree_map(lambda y: y.reshape(n * block, *y.shape[2:]), ys)
  if n * block == T:
    return carry, ys
  carry, tail = lax.scan(step, carry, tree_map(lambda x: x[n * block:], xs))
  return carry, tree_map(lambda y, t: jnp.concatenate([y, t]), ys, tail)
