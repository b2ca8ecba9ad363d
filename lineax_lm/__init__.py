"""Hybrid linear-attention language models in JAX: Flax NNX layers over pallas_kernels' chunked ops,
HybridLM, training, evaluation and distillation.

    import lineax_lm
    lm = lineax_lm.load("runs/x")                       # a training workdir or a save_pretrained folder
    lm.generate(["The cat", "Once upon a time"], max_new_tokens=32)
    model = lineax_lm.HybridLM(lineax_lm.ModelConfig(num_layers=4, hidden=256), nnx.Rngs(0))

The names below are imported on first use (`import lineax_lm` itself loads no JAX code).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "HybridLM": "lineax_lm.models.hybrid",
    "ModelConfig": "lineax_lm.models.config",
    "init_model": "lineax_lm.models.hybrid",
    "abstract_model": "lineax_lm.models.hybrid",
    "generate": "lineax_lm.models.generate",
    "generate_ragged": "lineax_lm.models.generate",
    "sample_logits": "lineax_lm.models.generate",
    "Pretrained": "lineax_lm.models.pretrained",
    "load": "lineax_lm.models.pretrained",
    "load_run": "lineax_lm.models.pretrained",
    "from_pretrained": "lineax_lm.models.pretrained",
    "save_pretrained": "lineax_lm.models.pretrained",
    "generate_batches": "lineax_lm.models.pretrained",
    "from_fla": "lineax_lm.convert.fla",
    "to_fla": "lineax_lm.convert.fla",
    "MIXERS": "lineax_lm.layers",
    "LINEAR_MIXERS": "lineax_lm.layers",
    "build_mixer": "lineax_lm.layers",
    "mixer_config": "lineax_lm.layers",
    "Context": "lineax_lm.layers",
    "LayerSpec": "lineax_lm.layers",
    "RMSNorm": "lineax_lm.layers",
    "SwiGLU": "lineax_lm.layers",
    "Attention": "lineax_lm.layers.attention",
    "LinearAttention": "lineax_lm.layers.linear_attn",
    "MultiScaleRetention": "lineax_lm.layers.retention",
    "SimpleGLA": "lineax_lm.layers.simple_gla",
    "GLA": "lineax_lm.layers.gla",
    "HGRN": "lineax_lm.layers.hgrn",
    "HGRN2": "lineax_lm.layers.hgrn2",
    "DeltaNet": "lineax_lm.layers.delta_net",
    "GatedDeltaNet": "lineax_lm.layers.gated_deltanet",
    "KDA": "lineax_lm.layers.kda",
    "RWKV6": "lineax_lm.layers.rwkv6",
    "MLSTM": "lineax_lm.layers.mlstm",
    "load_tokenizer": "lineax_lm.data.tokenizer",
    "ByteTokenizer": "lineax_lm.data.tokenizer",
    "train_and_evaluate": "lineax_lm.train.trainer",
    "base_config": "lineax_lm.train.config",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'lineax_lm' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
