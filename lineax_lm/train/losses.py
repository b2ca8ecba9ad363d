"""Next-token cross-entropy fused with the output head, chunked over time.

The plain objective materialises the float32 logits [B, L, vocab] (B=8, L=4096, vocab 32,000:
4.2 GB), then log-softmax and the gradient of both, and reads each several times. Here the logits of
one chunk of positions exist at a time: the forward keeps only the float32 log-sum-exp per token,
and the backward recomputes each chunk's logits to form (softmax - onehot) * mask and from it dx and
dhead (float32 accumulation), so the head costs three matmuls per chunk instead of three over the
whole batch plus ~5 full passes over the logits.

Chunks run along time on every row at once: the batch axis stays whole inside each chunk, so the
(data, fsdp) sharding of the rows and the `tensor` sharding of the head's vocab axis pass through
unchanged (the log-sum-exp, the argmax and the target pick reduce over the sharded vocab axis; XLA
adds the cross-device reductions). With T split over the `context` axis, each device's slice of a row
is a row of its own (the loss is a sum over tokens), so the chunks stay local too.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from lineax_lm import sharding

F32 = jnp.float32


def chunk_length(batch: int, length: int, chunk_tokens: int) -> int:
  """Positions per chunk so that a device's chunk holds about `chunk_tokens` tokens: the rows are
  split over the mesh's batch axes (when they divide the batch), so each device sees batch / shards
  rows of every chunk."""
  mesh = jax.sharding.get_abstract_mesh()
  shards = 1 if mesh.empty else math.prod(mesh.shape.get(a, 1) for a in sharding.BATCH_AXES)
  rows = batch // shards if batch % shards == 0 else batch
  return max(1, min(length, chunk_tokens // max(rows, 1)))


def chunked_cross_entropy(x, head, targets, mask, chunk_tokens: int):
  """Summed cross-entropy and correct-prediction count of the logits x @ head, without materialising
  them. x: [B, L, D] final normalised hidden states; head: [D, vocab] in x's dtype (matmuls run in
  it with float32 accumulation, as the plain head einsum); targets: [B, L] int; mask: [B, L] float
  loss weights. Returns float32 scalars (sum of ce * mask, sum of [argmax == target] * mask); only
  the first is differentiated. NaN in x (a packed-row overflow) makes the loss NaN."""
  B, L, _ = x.shape
  axis = sharding.context_axis(L)
  slices = 1 if axis is None else jax.sharding.get_abstract_mesh().shape[axis]
  size = chunk_length(B, L // slices, chunk_tokens)
  if slices > 1:  # T split over `context`: each device's slice becomes rows of its own, so the
    # chunks run over local positions (chunks of the global T would gather x onto every device)
    x, targets, mask = (a.reshape(B * slices, L // slices, *a.shape[2:]) for a in (x, targets, mask))
  return _cross_entropy(x, head, targets.astype(jnp.int32), mask.astype(F32), size)


def _chunks(length: int, size: int):
  """Number of chunks and, for chunk i, (start, fresh [size] bool): the last chunk is shifted back
  to end at `length` when `size` does not divide it, and `fresh` marks its positions that no earlier
  chunk covered (the others get zero weight), so one loop body serves every chunk."""
  count = -(-length // size)

  def chunk(i):
    start = jnp.minimum(i * size, length - size)
    return start, start + jnp.arange(size) >= i * size
  return count, chunk


def _logits(xc, head):
  return jnp.einsum("bld,dv->blv", xc, head, preferred_element_type=F32)


def _target_mask(logits, targets):
  return lax.broadcasted_iota(jnp.int32, logits.shape, 2) == targets[..., None]


def _forward(x, head, targets, mask, size):
  B, L, _ = x.shape
  count, chunk = _chunks(L, size)

  def body(i, carry):
    loss, correct, lse_all = carry
    start, fresh = chunk(i)
    take = lambda a: lax.dynamic_slice_in_dim(a, start, size, axis=1)
    logits, tc = _logits(take(x), head), take(targets)
    weight = take(mask) * fresh
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.sum(jnp.where(_target_mask(logits, tc), logits, 0.0), axis=-1)
    hit = (jnp.argmax(logits, axis=-1) == tc).astype(F32)
    return (loss + jnp.sum((lse - target_logit) * weight), correct + jnp.sum(hit * weight),
            lax.dynamic_update_slice_in_dim(lse_all, lse, start, axis=1))

  zero = jnp.zeros((), F32)
  return lax.fori_loop(0, count, body, (zero, zero, jnp.zeros((B, L), F32)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _cross_entropy(x, head, targets, mask, size):
  loss, correct, _ = _forward(x, head, targets, mask, size)
  return loss, correct


def _cross_entropy_fwd(x, head, targets, mask, size):
  loss, correct, lse = _forward(x, head, targets, mask, size)
  return (loss, correct), (x, head, targets, mask, lse)


def _cross_entropy_bwd(size, residuals, cotangents):
  x, head, targets, mask, lse = residuals
  dloss = cotangents[0].astype(F32)  # the correct count has no gradient
  L = x.shape[1]
  count, chunk = _chunks(L, size)

  def body(i, carry):
    dx, dhead = carry
    start, fresh = chunk(i)
    take = lambda a: lax.dynamic_slice_in_dim(a, start, size, axis=1)
    xc, tc = take(x), take(targets)
    logits = _logits(xc, head)
    weight = take(mask) * fresh * dloss
    probs = jnp.exp(logits - take(lse)[..., None])
    dlogits = ((probs - _target_mask(logits, tc)) * weight[..., None]).astype(x.dtype)
    dxc = jnp.einsum("blv,dv->bld", dlogits, head, preferred_element_type=F32).astype(x.dtype)
    dxc = jnp.where(fresh[None, :, None], dxc, take(dx))  # positions an earlier chunk wrote
    dhead = dhead + jnp.einsum("bld,blv->dv", xc, dlogits, preferred_element_type=F32)
    return lax.dynamic_update_slice_in_dim(dx, dxc, start, axis=1), dhead

  dx, dhead = lax.fori_loop(0, count, body, (jnp.zeros_like(x), jnp.zeros(head.shape, F32)))
  return dx, dhead.astype(head.dtype), None, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)
