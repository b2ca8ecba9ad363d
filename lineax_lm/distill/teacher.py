"""The teacher as an NNX model: a Hugging Face Llama checkpoint -> an all-attention HybridLM.

    ckpt = load_teacher(smollm2_gguf_path())
    teacher, cfg = teacher_from_checkpoint(ckpt)                # HybridLM (a Llama), ModelConfig
    logits = teacher(jnp.array([[504, 3575, 282, 4649, 314]]))  # "The capital of France is"

An all-attention HybridLM is exactly HF's LlamaForCausalLM (lineax_lm/models/README.md); the names
map one to one (an nnx `kernel` is the transposed torch `weight`):

  model.embed_tokens.weight                         embed.embedding
  model.layers.{i}.input_layernorm.weight           blocks.{i}.attn_norm.weight
  model.layers.{i}.self_attn.{q,k,v,o}_proj.weight  blocks.{i}.mixer.{q,k,v,o}_proj.kernel (T)
  model.layers.{i}.post_attention_layernorm.weight  blocks.{i}.mlp_norm.weight
  model.layers.{i}.mlp.{gate,up,down}_proj.weight   blocks.{i}.mlp.{gate,up,down}_proj.kernel (T)
  model.norm.weight                                 norm.weight
  lm_head.weight (untied only)                      lm_head (T)

`tiny_teacher()` draws a small random Llama in the same HF form (the `runlocal` teacher of the
distillation configs and of the tests).
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from flax import nnx

from lineax_lm.distill.checkpoints import TeacherCheckpoint
from lineax_lm.distill.gguf_file import check_llama_params, llama_param_shapes
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import HybridLM, abstract_model

_LAYER = {
    "input_layernorm.weight": (("attn_norm", "weight"), False),
    "post_attention_layernorm.weight": (("mlp_norm", "weight"), False),
    **{f"self_attn.{p}_proj.weight": (("mixer", f"{p}_proj", "kernel"), True) for p in "qkvo"},
    **{f"mlp.{p}_proj.weight": (("mlp", f"{p}_proj", "kernel"), True) for p in ("gate", "up", "down")},
}


def teacher_model_config(hf_config: Mapping[str, Any], **overrides) -> ModelConfig:
  """A Hugging Face LlamaConfig dict -> the all-attention ModelConfig of the same network.
  `overrides`: other ModelConfig fields (dtype, param_dtype, backend, attn_impl, remat, ...)."""
  c = hf_config
  return ModelConfig(
      vocab_size=c["vocab_size"], num_layers=c["num_hidden_layers"], hidden=c["hidden_size"],
      heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
      mlp_hidden=c["intermediate_size"], attn_ratio="transformer",
      tie_embeddings=bool(c["tie_word_embeddings"]), rope_theta=float(c["rope_theta"]),
      norm_eps=float(c["rms_norm_eps"]), **overrides)


def hf_to_nnx(name: str) -> tuple[tuple, bool]:
  """HF Llama parameter name -> (HybridLM parameter path, transpose?)."""
  parts = name.split(".")
  if name == "model.embed_tokens.weight":
    return ("embed", "embedding"), False
  if name == "model.norm.weight":
    return ("norm", "weight"), False
  if name == "lm_head.weight":
    return ("lm_head",), True
  if parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in _LAYER:
    path, transpose = _LAYER[".".join(parts[3:])]
    return ("blocks", int(parts[2]), *path), transpose
  raise ValueError(f"{name!r} is not a Hugging Face Llama parameter name")


def with_values(model: nnx.Module, values: Mapping[tuple, np.ndarray], *, complete: bool = False):
  """The model with the parameters at `values`' paths replaced by device arrays (same shapes, cast to
  each parameter's dtype). `model` may be abstract (`abstract_model`); then `complete` must hold: every
  parameter needs a value. Returns a new module; `model` is not changed."""
  graphdef, state = nnx.split(model)
  flat = dict(nnx.to_flat_state(state))
  unknown = sorted(map(str, set(values) - set(flat)))
  if unknown:
    raise ValueError(f"values: no parameter at {unknown[:4]}")
  if complete and set(flat) != set(values):
    raise ValueError(f"values: parameters {sorted(map(str, set(flat) - set(values)))[:4]} have none")
  for path, value in values.items():
    var = flat[path]
    if tuple(var.shape) != tuple(np.shape(value)):
      raise ValueError(f"values: {'.'.join(map(str, path))} is {var.shape}; got {np.shape(value)}")
    flat[path] = var.replace(jnp.asarray(value, dtype=var.dtype))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def teacher_from_checkpoint(ckpt: TeacherCheckpoint, **overrides) -> tuple[HybridLM, ModelConfig]:
  """TeacherCheckpoint (HF names, float32 numpy) -> (all-attention HybridLM, its ModelConfig).
  `overrides` go to `teacher_model_config` (dtype, backend, ...)."""
  cfg = teacher_model_config(ckpt.config, **overrides)
  check_llama_params(ckpt.config, ckpt.params, source=ckpt.source)
  values = {}
  for name, value in ckpt.params.items():
    path, transpose = hf_to_nnx(name)
    values[path] = value.T if transpose else value
  return with_values(abstract_model(cfg), values, complete=True), cfg


# ----------------------------------------------------------------------------- a tiny teacher
def tiny_teacher_config(vocab_size: int = 259, **overrides) -> dict[str, Any]:
  """A LlamaConfig dict of a tiny Llama (2 layers, hidden 32, 4 heads of 8, 2 KV heads, MLP 64);
  vocab 259 = the byte tokenizer of lineax_lm.data."""
  config = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_act="silu",
                rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, vocab_size=vocab_size,
                max_position_embeddings=2048, tie_word_embeddings=True, attention_bias=False,
                mlp_bias=False, bos_token_id=256, eos_token_id=257, pad_token_id=258)
  config.update(overrides)
  return config


def tiny_teacher(seed: int = 0, std: float = 0.3, embed_std: float = 0.6,
                 **config_overrides) -> TeacherCheckpoint:
  """A random tiny Llama in Hugging Face form (no tokenizer: use the byte tokenizer). Matrices are
  normal(0, std), norms ~1. The embedding (tied head) rows of ASCII bytes are normal(0, embed_std),
  those of ids >= 128 (non-ASCII bytes, specials) zero, so that ASCII logits spread widely around
  the others' 0: samples are ASCII text (> 99%) that encodes back to the same bytes."""
  config = tiny_teacher_config(**config_overrides)
  rng = np.random.default_rng(seed)
  params = {k: (1.0 + 0.1 * rng.standard_normal(s) if len(s) == 1 else std * rng.standard_normal(s))
            .astype(np.float32) for k, s in llama_param_shapes(config).items()}
  embed = params["model.embed_tokens.weight"]
  embed *= embed_std / std
  embed[128:] = 0.0
  return TeacherCheckpoint(config=config, params=params, tokenizer=None, source="tiny_teacher",
                           tensor_types={k: "F32" for k in params})


def save_safetensors_dir(ckpt: TeacherCheckpoint, path: str) -> str:
  """Writes config.json + model.safetensors (HF names): a directory `load_teacher` reads back."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    json.dump(ckpt.config, f, indent=1)
  safetensors.numpy.save_file(dict(ckpt.params), os.path.join(path, "model.safetensors"))
  return path
