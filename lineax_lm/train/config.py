"""The base training config; files in configs/ start from it and override a few fields."""
from __future__ import annotations

import ml_collections

from lineax_lm.data.pipeline import default_data_config


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # lineax_lm.models.hybrid.ModelConfig fields (any subset; the rest keep their defaults).
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=256, num_layers=4, hidden=128, heads=4, mixer="gated_deltanet", attn_ratio="pure",
      tie_embeddings=False, dtype="float32", param_dtype="float32", remat="none", backend="auto",
      mixer_cfg=ml_collections.ConfigDict()))
  c.data = default_data_config()
  c.train = ml_collections.ConfigDict(dict(
      steps=1000, grad_accum=1,  # batch size: config.data.global_batch_size
      lr=1e-3, min_lr_ratio=0.1, warmup_steps=100, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1,
      clip_norm=1.0,
      # Tokens per chunk of the fused head + cross-entropy (train.losses; per device: the rows are
      # split over the batch axes); 0: plain float32 logits [B, L, vocab]. 4,096 tokens keep one
      # chunk's float32 logits at 0.5 GiB at vocab 32,000 while each head matmul is still
      # 4,096 x D x vocab (thousands of output tiles: full rate); B=8, T=4096 is then 8 chunks.
      loss_chunk=4096,
      log_every=50, checkpoint_every=500, async_checkpointing=True,
      keep_checkpoints=3,  # the latest steps kept; 0 keeps every step (the last always stays)
      restore_step=-1,  # -1: the latest checkpoint
      # jax.profiler trace of steps profile_start+1 .. profile_start+profile_steps (0: none) into
      # <workdir>/profile, summarised in the log and in profile/summary.md (device time per step)
      profile_steps=0, profile_start=10))
  c.eval = ml_collections.ConfigDict(dict(every=500, steps=4, seed=10_000))
  # -1: all remaining devices. context > 1 splits every sequence into that many contiguous slices,
  # one per device (context parallelism: data.seq_len must be a multiple of it).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, context=1, tensor=1))
  return c
