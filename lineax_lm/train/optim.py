"""The optimizer: AdamW with warmup + cosine decay, global-norm clipping and a weight-decay mask."""
from __future__ import annotations

import jax
import optax


def learning_rate_schedule(cfg):
  """The learning rate of each optimizer step count: linear warmup from 0 to `cfg.lr` over
  `cfg.warmup_steps` counts (none when 0: the first step trains at `cfg.lr`), then cosine decay to
  `cfg.lr * cfg.min_lr_ratio`, reached at count `cfg.steps` and kept after it."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
      decay_steps=max(cfg.steps, cfg.warmup_steps + 1), end_value=cfg.lr * cfg.min_lr_ratio)


def decay_mask(params):
  """Weight decay on matrices only: no decay on norms, biases, gates' scalars, or embeddings' 1-D
  companions (any parameter with fewer than 2 dims)."""
  return jax.tree_util.tree_map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def make_optimizer(cfg) -> optax.GradientTransformation:
  """cfg: the `train` section (lr, min_lr_ratio, warmup_steps, steps, b1, b2, eps, weight_decay,
  clip_norm)."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.clip_norm) if cfg.clip_norm else optax.identity(),
      optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                  weight_decay=cfg.weight_decay, mask=decay_mask),
  )
