"""ModelConfig: the fields that describe a HybridLM (widths, depth, the linear mixer and its
options, where attention goes, numerics, remat), checked when built, and the configs of the layers
built from it. A config file's model section (a preset and overrides) becomes a ModelConfig through
`lineax_lm.models.presets.model_config`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from lineax_lm.layers import LayerSpec, mixer_config, mlp_width
from lineax_lm.layers.common import INIT_STD
from lineax_lm.layers.channel_mix import channel_mix_width
from lineax_lm.models.placement import attention_layers

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


RESIDUAL_INITS = ("normal", "rescale")
# What surrounds each mixer in a block (attention layers included):
BLOCKS = {
    # x + mixer(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)): fla's blocks for every model type but
    # RWKV-6, and Llama's
    "swiglu": "RMSNorm + SwiGLU",
    # x + mixer(LayerNorm(x)), then x + RWKV6ChannelMix(LayerNorm(x)), LayerNorms with biases and
    # one more LayerNorm on the embeddings: fla's RWKV6Block (norm_first, norm_bias)
    "rwkv6": "LayerNorm + RWKV-6 channel mix",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int = 32000
  num_layers: int = 24
  hidden: int = 1024
  heads: int = 16                          # attention heads
  kv_heads: int | None = None              # attention key/value heads (GQA); None = heads
  head_dim: int | None = None              # attention head dim; None = hidden // heads
  # None: fla's rule, 8/3 hidden rounded up to 256 (block "rwkv6": 3.5 hidden rounded up to 32)
  mlp_hidden: int | None = None
  linear_mlp_hidden: int | None = None     # MLP width of the linear-mixer blocks (default mlp_hidden)
  block: str = "swiglu"                    # BLOCKS: the norms and feed-forward around each mixer
  mixer: str = "gated_deltanet"            # the linear mixer (lineax_lm.layers.MIXERS)
  mixer_cfg: Any = ()                      # overrides of the mixer's config (dict or item pairs)
  attn_ratio: str = "pure"                 # "pure" | "transformer" | "attention" | "r:1"
  attn_layers: tuple | None = None         # explicit attention layer indices (override attn_ratio)
  window: int | None = None                # sliding window of the attention layers
  attn_short_conv: bool = False            # short convolutions on the attention layers' q, k, v
  rope_theta: float = 10000.0
  attn_impl: str | None = None             # jax.nn.dot_product_attention implementation
  norm_eps: float = 1e-6
  tie_embeddings: bool = False
  init_std: float = INIT_STD
  # "rescale": the projections that write a block's branches into the residual stream (mixer
  # o_proj, MLP down_proj) start at init_std / sqrt(2 * num_layers) (GPT-2's scheme, fla's
  # prenorm_residual_strategy="rescale"); "normal": at init_std, as every other weight (fla's
  # default)
  residual_init: str = "normal"
  remat: str = "none"                      # REMAT_POLICIES
  dtype: str = "float32"                   # activations
  param_dtype: str = "float32"
  backend: str = "auto"                    # op backend for every mixer
  max_segments: int = 16                   # packed sequences per row (static bound under jit)
  scan_layers: bool = False                # training forward as a lax.scan over repeating blocks
  # Training: the linear mixers' GPU kernels keep their chunk-start states (and the delta rules'
  # WY factors) for the backward instead of forming them again there (pallas_kernels'
  # Config.keep_states, fla's disable_recompute): one serial pass fewer a layer, more memory (the
  # 475M GDN at 32,768 tokens: 0.8 GiB a layer). Always on under `remat` (any policy but "none"):
  # the backward recomputes the layer's forward, which then keeps the states that the backward
  # would otherwise form again, at no more memory (three state passes a layer become two)
  keep_states: bool = False

  def __post_init__(self):
    items = self.mixer_cfg.items() if isinstance(self.mixer_cfg, Mapping) else self.mixer_cfg
    object.__setattr__(self, "mixer_cfg", tuple(sorted(dict(items).items())))
    if self.attn_layers is not None:
      object.__setattr__(self, "attn_layers", tuple(int(i) for i in self.attn_layers))
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"`remat` must be one of {sorted(REMAT_POLICIES)}; got {self.remat!r}")
    if self.block not in BLOCKS:
      raise ValueError(f"`block` must be one of {sorted(BLOCKS)}; got {self.block!r}")
    if self.residual_init not in RESIDUAL_INITS:
      raise ValueError(f"`residual_init` must be one of {RESIDUAL_INITS}; got {self.residual_init!r}")
    # The command line's range table (it imports this module: imported here, not at the top).
    from lineax_lm.train.validation import check_model_config
    check_model_config(self)
    attention_layers(self.num_layers, self.attn_ratio, self.attn_layers)  # validates

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @property
  def attention_indices(self) -> tuple:
    return attention_layers(self.num_layers, self.attn_ratio, self.attn_layers)

  def mlp_width(self, attention: bool) -> int:
    """The feed-forward width of an attention block (`attention`) or of a linear-mixer block."""
    width = None if attention else self.linear_mlp_hidden
    if width or self.mlp_hidden:
      return width or self.mlp_hidden
    return channel_mix_width(self.hidden) if self.block == "rwkv6" else mlp_width(self.hidden)

  def layer_spec(self) -> LayerSpec:
    # Nothing layer-specific: blocks of one kind are then identical up to their parameters, so
    # they share one trace (call_shared).
    # "rescale": the residual stream of a pre-norm stack starts as the sum of 2L branch outputs;
    # scaled by 1/sqrt(2L) the sum starts at the variance of one branch, whatever the depth.
    scale = 1 / math.sqrt(2 * self.num_layers) if self.residual_init == "rescale" else 1.0
    return LayerSpec(self.hidden, jnp.dtype(self.dtype), jnp.dtype(self.param_dtype), self.init_std,
                     scale)

  def linear_mixer_config(self):
    return mixer_config(self.mixer, **{"norm_eps": self.norm_eps, "backend": self.backend,
                                       **dict(self.mixer_cfg)})

  def attention_config(self):
    return mixer_config("attention", num_heads=self.heads, num_kv_heads=self.kv_heads,
                        head_dim=self.head_dim, rope_theta=self.rope_theta, window=self.window,
                        attn_impl=self.attn_impl, use_short_conv=self.attn_short_conv,
                        norm_eps=self.norm_eps, backend=self.backend)
