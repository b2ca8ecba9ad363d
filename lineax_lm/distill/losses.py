"""The distillation losses, one per stage, as `Objective.loss` functions of (student, batch, teacher
parameters): token sums (loss_sum, (correct_sum, count)) over the batch's `loss_mask`.

  layer  (stage 1)  every linear layer i of the student: its mixer on the teacher's normalised
                    hidden state at layer i, against the teacher's attention output there
                      mean_i || mixer_s(norm(h_i)) - attn_t(norm(h_i)) ||^2 / D
  block  (stage 2)  every linear block i: the student block on the teacher's h_i, against h_{i+1}
                      mean_i || block_s(h_i) - h_{i+1} ||^2 / D
  e2e    (stage 3)  the whole student: ce_weight * CE(targets) + kl_weight * T^2 KL(p_t^T || p_s^T),
                    p^T = softmax(logits / T)

With `relative`, each layer's squared error is divided by the mean square of its target over the
batch's tokens (a constant of the batch), so that layers whose outputs are large do not drown the
others: stage 1 by the attention output's, stage 2 by the block's update h_{i+1} - h_i (the residual
stream itself grows with depth and carries a few huge channels); a student mixer that outputs zeros,
or a block that adds nothing, scores 1. Stages 1 and 2 measure no next-token accuracy (correct_sum
is 0); stage 3's is the student's greedy accuracy. Teacher activations never carry gradients.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from lineax_lm.layers import Context
from lineax_lm.models.compile import call_shared
from lineax_lm.models.hybrid import make_packing

F32 = jnp.float32


def context(model, batch) -> tuple[Context, jax.Array | None]:
  """The Context a HybridLM builds for `batch` (positions, packing of `segment_ids`), and the flag
  that the packed sequences overflowed the model's `max_segments` bound (None when unpacked)."""
  inputs, seg, pos = batch["inputs"], batch.get("segment_ids"), batch.get("positions")
  B, L = inputs.shape
  packing = overflow = None
  if seg is not None:
    packing, seg_pos, overflow = make_packing(seg, model.config.max_segments)
    pos = seg_pos if pos is None else pos
  pos = jnp.arange(L, dtype=jnp.int32) if pos is None else pos
  return Context(jnp.broadcast_to(pos, (B, L)).astype(jnp.int32), packing), overflow


def teacher_states(teacher, batch, ctx: Context):
  """Hidden states h_0 (embeddings) .. h_N (before the final norm) [B, L, D] and the attention
  outputs y_0 .. y_{N-1} [B, L, D] of an all-attention teacher, without gradients."""
  x = teacher.embed(batch["inputs"])
  hiddens, outs = [x], []
  for block in teacher.blocks:
    x, y = call_shared(_teacher_block, block, x, ctx)
    hiddens.append(x)
    outs.append(y)
  return jax.lax.stop_gradient((hiddens, outs))


# Module-level layer functions for call_shared (identical layers share one trace).
def _teacher_block(block, x, ctx):
  y, _ = block.mixer(block.attn_norm(x), None, ctx)
  x = x + y
  return x + block.mlp(block.mlp_norm(x)), y


def _mixer_output(block, h, ctx):
  return block.mixer(block.attn_norm(h), None, ctx)[0]


def _block_output(block, h, ctx):
  return block(h, None, ctx)[0]


def _squared_error(pred, target, mask, relative: bool):
  """Per-token mean over D of (pred - target)^2 [B, L], divided by the target's mean square over
  the masked tokens when `relative`."""
  err = jnp.mean(jnp.square(pred.astype(F32) - target.astype(F32)), axis=-1)
  if relative:
    ms = jnp.sum(jnp.mean(jnp.square(target.astype(F32)), -1) * mask) / jnp.maximum(jnp.sum(mask), 1)
    err = err / jnp.maximum(ms, 1e-12)
  return err


def _finish(per_token, mask, overflow, correct=None):
  loss_sum = jnp.sum(per_token * mask)
  if overflow is not None:  # more packed sequences than max_segments: fail loudly, as the model does
    loss_sum = jnp.where(overflow, jnp.nan, loss_sum)
  return loss_sum, (jnp.zeros((), F32) if correct is None else correct, jnp.sum(mask))


def alignment_loss(student, teacher, batch, *, layers, level: str, relative: bool = True):
  """Stages 1 and 2, averaged over the student's `layers` (its linear layers) i:
  level "layer": the student's mixer on the teacher's normalised h_i vs the teacher's attention output;
  level "block": the student's block on the teacher's h_i vs the teacher's h_{i+1}."""
  ctx, overflow = context(student, batch)
  hiddens, outs = teacher_states(teacher, batch, ctx)
  mask = batch["loss_mask"].astype(F32)
  per_token = 0.0
  for i in layers:
    block = student.blocks[i]
    if level == "layer":
      pred, target = call_shared(_mixer_output, block, hiddens[i], ctx), outs[i]
    else:  # the block's update of the residual stream: same error, scaled by the update's size
      h = hiddens[i].astype(F32)
      pred = call_shared(_block_output, block, hiddens[i], ctx).astype(F32) - h
      target = hiddens[i + 1].astype(F32) - h
    per_token = per_token + _squared_error(pred, target, mask, relative)
  return _finish(per_token / len(layers), mask, overflow)


def e2e_loss(student, teacher, batch, *, ce_weight: float = 1.0, kl_weight: float = 1.0,
             temperature: float = 1.0):
  """Stage 3: ce_weight * CE + kl_weight * T^2 * KL(teacher^T || student^T) per token."""
  args = (batch["inputs"], batch.get("segment_ids"), batch.get("positions"))
  logits = student(*args)
  mask = batch["loss_mask"].astype(F32)
  per_token = ce_weight * optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  if kl_weight:
    t_logp = jax.nn.log_softmax(jax.lax.stop_gradient(teacher(*args)) / temperature, -1)
    s_logp = jax.nn.log_softmax(logits / temperature, -1)
    kl = jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), -1)
    per_token = per_token + kl_weight * temperature ** 2 * kl
  correct = jnp.sum((jnp.argmax(logits, -1) == batch["targets"]).astype(F32) * mask)
  return _finish(per_token, mask, None, correct)


def make_loss(stage: str, teacher_graphdef: nnx.GraphDef, **kwargs):
  """The Objective.loss of a stage: (student, batch, teacher params) -> token sums."""
  fn = {"layer": functools.partial(alignment_loss, level="layer"),
        "block": functools.partial(alignment_loss, level="block"), "e2e": e2e_loss}.get(stage)
  if fn is None:
    raise ValueError(f"stage: {stage!r} has no distillation loss; choose one of layer, block, e2e")

  def loss(student, batch, teacher_params):
    return fn(student, nnx.merge(teacher_graphdef, teacher_params), batch, **kwargs)
  return loss
