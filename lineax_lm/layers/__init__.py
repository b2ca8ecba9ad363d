"""Flax NNX token mixers (one per pallas_kernels op family), softmax attention, RMSNorm, SwiGLU.

Every mixer is called as `mixer(x [B, L, D], cache=None, ctx=None) -> (y [B, L, D], new cache)`:
no cache = training (chunk op); a cache and L > 1 = prefill (chunk op, final state kept); a cache and
L == 1 = decode (fused_recurrent op). `mixer.init_cache(batch, max_len)` builds a zero cache and
`mixer.cache_bytes(context_len)` gives one sequence's cache size from the layer's dimensions.

The registry maps mixer names to (module, layer class, config class, config defaults); modules are
imported on first use, so a model only needs the ops it runs.
"""
from __future__ import annotations

import dataclasses
import importlib

from lineax_lm.layers.common import (Context, LayerSpec, MixerConfig, Packing, RMSNorm, SwiGLU,
                                     mlp_width)

MIXERS = {
    "attention": ("attention", "Attention", "AttentionConfig", {}),
    "linear_attn": ("linear_attn", "LinearAttention", "LinearAttentionConfig", {}),
    "retention": ("retention", "MultiScaleRetention", "RetentionConfig", {}),
    "simple_gla": ("simple_gla", "SimpleGLA", "SimpleGLAConfig", {}),
    "mamba2": ("simple_gla", "SimpleGLA", "SimpleGLAConfig", {"gate": "mamba2"}),
    "gla": ("gla", "GLA", "GLAConfig", {}),
    "hgrn": ("hgrn", "HGRN", "HGRNConfig", {}),
    "hgrn2": ("hgrn2", "HGRN2", "HGRN2Config", {}),
    "deltanet": ("delta_net", "DeltaNet", "DeltaNetConfig", {}),
    "gated_deltanet": ("gated_deltanet", "GatedDeltaNet", "GatedDeltaNetConfig", {}),
    "kda": ("kda", "KDA", "KDAConfig", {}),
    "rwkv6": ("rwkv6", "RWKV6", "RWKV6Config", {}),
    "mlstm": ("mlstm", "MLSTM", "MLSTMConfig", {}),
}
LINEAR_MIXERS = tuple(n for n in MIXERS if n != "attention")


def _lookup(name: str):
  if name not in MIXERS:
    raise ValueError(f"unknown mixer {name!r}; choose one of {sorted(MIXERS)}")
  module, layer, config, defaults = MIXERS[name]
  mod = importlib.import_module(f"lineax_lm.layers.{module}")
  return getattr(mod, layer), getattr(mod, config), defaults


def mixer_config(name: str, **overrides) -> MixerConfig:
  """The config dataclass of mixer `name`: fla's defaults, the registry's, then `overrides`."""
  _, config_cls, defaults = _lookup(name)
  fields = {f.name for f in dataclasses.fields(config_cls)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"mixer {name!r} has no option(s) {unknown}; its options: {sorted(fields)}")
  return config_cls(**{**defaults, **overrides})


def build_mixer(name: str, cfg: MixerConfig, spec: LayerSpec, rngs):
  layer_cls, _, _ = _lookup(name)
  return layer_cls(cfg, spec, rngs)


__all__ = ["MIXERS", "LINEAR_MIXERS", "Context", "LayerSpec", "MixerConfig", "Packing", "RMSNorm",
           "SwiGLU", "build_mixer", "mixer_config", "mlp_width"]
