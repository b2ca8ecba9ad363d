"""The base training config; files in configs/ start from it and override a few fields."""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

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
      profile_steps=0, profile_start=10,
      # XLA's persistent compilation cache (a folder, local or gs://; "" leaves jax's setting, e.g.
      # JAX_COMPILATION_CACHE_DIR): a relaunch of the same step on the same devices and versions,
      # a resume after preemption included, loads the compiled step instead of compiling it again
      compilation_cache=""))
  c.eval = ml_collections.ConfigDict(dict(every=500, steps=4, seed=10_000))
  # -1: all remaining devices. context > 1 splits every sequence into that many contiguous slices,
  # one per device (context parallelism: data.seq_len must be a multiple of it).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, context=1, tensor=1))
  return c


def lm_config(preset: str = "", tokens: int = 0) -> ml_collections.ConfigDict:
  """Language-model pretraining on text: `base_config()` with a model named by a preset
  (lineax_lm.models.presets), a token budget, a text corpus and a held-out split.

    python -m lineax_lm.train --config configs/lm.py --workdir runs/gdn_6to1 \\
        --config.model.preset=gated_deltanet_340m --config.model.attn_ratio=6:1 \\
        --config.train.tokens=20_000_000_000 --config.data.source=parquet \\
        --config.data.paths='fineweb-edu/sample/10BT/*.parquet' --config.data.tokenizer=tok.json

  model   preset (required), and the fields a preset run may change: attn_ratio, attn_layers,
          attn_placement ("spread", the default here: the ratio's share of attention at any depth,
          lineax_lm.models.placement.spread_attention_layers; "periodic": attention_layers),
          mixer_cfg (options added to the preset's), dtype, param_dtype, backend, remat, attn_impl,
          scan_layers, keep_states. A field left None keeps the preset's value.
  train   tokens: the budget; steps = tokens // (data.global_batch_size * data.seq_len), warmup
          1/32 of them, a checkpoint every quarter (all derived lazily: overriding tokens, the batch
          or the length on the command line moves them). Setting train.steps directly cuts the link.
  data    a text source (text / jsonl / parquet / tfds) with the held-out split of
          lineax_lm.data.splits (`split`, `heldout_fraction`, `heldout_paths`, `tfds_heldout_split`).
  """
  c = base_config()
  c.model = ml_collections.ConfigDict(dict(
      preset=preset, attn_ratio=config_dict.placeholder(str),
      attn_layers=config_dict.placeholder(tuple), attn_placement="spread",
      mixer_cfg=ml_collections.ConfigDict(), dtype=config_dict.placeholder(str),
      param_dtype=config_dict.placeholder(str), backend=config_dict.placeholder(str),
      remat=config_dict.placeholder(str), attn_impl=config_dict.placeholder(str),
      scan_layers=config_dict.placeholder(bool), keep_states=config_dict.placeholder(bool)))
  c.data.update(dict(source="jsonl", seq_len=2048, global_batch_size=256, heldout_fraction=0.01))
  c.train.update(dict(lr=3e-4, min_lr_ratio=0.1, weight_decay=0.1, b2=0.95, log_every=50,
                      compilation_cache="~/.cache/lineax_lm/jax_compilation_cache"))
  with c.unlocked():
    c.train.tokens = tokens
  steps = c.train.get_ref("tokens") // (c.data.get_ref("global_batch_size") * c.data.get_ref("seq_len"))
  c.train.steps = steps
  c.train.warmup_steps = steps // 32
  c.train.checkpoint_every = (steps + 3) // 4
  c.eval.every = (steps + 3) // 4
  return c
