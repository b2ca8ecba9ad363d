"""Efficiency accounting: token-mixer FLOPs per token and layer, cache bytes, measured tokens/s, and
the quality-vs-cost Pareto plot.

FLOPs count a multiply-add as 2, forward pass only (training is about 3x), per token and per layer,
for H heads of key dim K and value dim V (a linear layer's recurrent state is H x K x V), chunk C:

  softmax attention at context L (window W: L -> min(L, W)), H heads of dim Dh:
      logits 2 L H Dh + weighted sum 2 L H Dh = 4 L H Dh
      (Hoffmann et al. 2022, "Chinchilla", Appendix F, per token; the token at position L of a causal
      sequence, i.e. decode at context L; averaged over a causal training sequence it is half)
  additive chunked linear mixers (linear attention, RetNet, GLA, simple GLA / Mamba-2, HGRN-2,
  RWKV-6, mLSTM), per head (Yang et al. 2024, "Gated Linear Attention", Sec. 3 chunkwise form):
      inter-chunk q S 2KV + state update K^T V 2KV + intra-chunk scores 2CK + scores V 2CV
      = 4 K V + 2 C (K + V)
      (mLSTM's normaliser n is one more value column: V -> V + 1; RWKV-6's bonus u adds 2K + 2V)
  delta-rule chunked mixers (DeltaNet, Gated DeltaNet, KDA), per head (Yang et al. 2024,
  "Parallelizing Linear Transformers with the Delta Rule", WY / UT transform):
      K K^T 2CK + (I + A)^-1 C^2/3 + W = T K 2CK + U = T V 2CV + U - W S 2KV
      + q S 2KV + scores 2CK + scores U 2CV + S += K^T U 2KV
      = 6 K V + 2 C (3 K + 2 V) + C^2 / 3
  elementwise recurrences (HGRN, width D_h): 3 D_h (gate multiply, add, output)
  recurrent decode (one token, no chunk): additive 4 K V, delta rule 6 K V (S^T k, k u^T, S^T q),
  plus K V for a decay multiply in gated variants.

These are the O(K V + C (K + V)) per head-token vs O(L d) per token forms that Wang et al. 2025
("A Systematic Analysis of Hybrid Linear Attention", arXiv 2507.06457) compare; elementwise gate and
norm work (O(K + V) per head-token) is left out. Projections are counted apart: 2 x the mixer's
weight-matrix parameters per token (the same for prefill and decode).

Cache bytes come from the model (`HybridLM.cache_bytes`): KV caches grow with L, recurrent states
do not. `measure_tokens_per_s` times a jitted forward pass on the current device.
"""
from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import HybridLM, abstract_model, init_model

ADDITIVE = ("linear_attn", "retention", "simple_gla", "mamba2", "gla", "hgrn2", "rwkv6", "mlstm")
DELTA = ("deltanet", "gated_deltanet", "kda")
ELEMENTWISE = ("hgrn",)
GATED = ("retention", "simple_gla", "mamba2", "gla", "hgrn2", "rwkv6", "mlstm", "gated_deltanet", "kda")


def attention_flops(context_len: int, heads: int, head_dim: int, window: int | None = None) -> float:
  """4 L H Dh: forward FLOPs of one token attending to `context_len` keys (window-capped)."""
  L = context_len if window is None else min(context_len, window)
  return 4.0 * L * heads * head_dim


def linear_flops(mixer: str, heads: int, k: int, v: int, chunk: int = 64, decode: bool = False) -> float:
  """Forward token-mixing FLOPs of one token through a linear mixer (see the module docstring)."""
  if mixer in ELEMENTWISE:
    return 3.0 * k                                 # k is the width of the elementwise state
  if mixer == "mlstm":
    v = v + 1
  extra = 2.0 * (k + v) if mixer == "rwkv6" else 0.0
  decay = k * v if (decode and mixer in GATED) else 0.0
  if mixer in ADDITIVE:
    per_head = 4 * k * v + decay if decode else 4 * k * v + 2 * chunk * (k + v)
  elif mixer in DELTA:
    per_head = 6 * k * v + decay if decode else 6 * k * v + 2 * chunk * (3 * k + 2 * v) + chunk**2 / 3
  else:
    raise ValueError(f"no FLOP formula for mixer {mixer!r}")
  return heads * (per_head + extra)


def _matrix_params(module) -> int:
  return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(nnx.state(module, nnx.Param))
             if len(x.shape) >= 2)


def layer_costs(config: ModelConfig, context_len: int, chunk: int = 64, decode: bool = False) -> list[dict]:
  """Per layer: {"layer", "kind", "mixing_flops", "projection_flops", "state_dims"} per token at
  `context_len` (decode: one new token after context_len cached ones)."""
  model = abstract_model(config)
  rows = []
  for i, block in enumerate(model.blocks):
    mixer = block.mixer
    if block.is_attention:
      cfg = mixer.cfg
      flops = attention_flops(context_len, cfg.num_heads, mixer.head_dim, cfg.window)
      kind, dims = "attention", (cfg.num_heads, mixer.head_dim)
    else:
      shape = mixer.state_shapes[0]
      h, k, v = (1, shape[0], 1) if len(shape) == 1 else shape
      flops = linear_flops(config.mixer, h, k, v, chunk, decode)
      kind, dims = config.mixer, tuple(shape)
    rows.append(dict(layer=i, kind=kind, mixing_flops=flops,
                     projection_flops=2.0 * _matrix_params(mixer), state_dims=dims))
  return rows


def model_costs(config: ModelConfig, context_len: int, chunk: int = 64) -> dict:
  """Whole-model summary at `context_len`: mixing / projection FLOPs per token (prefill and decode),
  cache bytes per sequence, parameters."""
  prefill = layer_costs(config, context_len, chunk)
  decode = layer_costs(config, context_len, chunk, decode=True)
  cache = abstract_model(config).cache_bytes(context_len)
  from lineax_lm.models.presets import count_params
  return dict(context_len=context_len,
              mixing_flops=sum(r["mixing_flops"] for r in prefill),
              decode_mixing_flops=sum(r["mixing_flops"] for r in decode),
              projection_flops=sum(r["projection_flops"] for r in prefill),
              cache_bytes=cache["total"], kv_cache_bytes=cache["attention"],
              state_cache_bytes=cache["linear"], params=count_params(config)["total"])


def measure_tokens_per_s(model_or_config, batch: int = 4, seq_len: int = 512, repeats: int = 3,
                         seed: int = 0) -> float:
  """Forward-pass throughput (tokens/s) of a jitted `model(tokens)` on the default device, best of
  `repeats` timed calls after one compile call."""
  model = model_or_config
  if isinstance(model, ModelConfig):
    model = init_model(model, seed)
  graphdef, state = nnx.split(model)
  fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
  x = jnp.asarray(np.random.default_rng(seed).integers(0, model.config.vocab_size, (batch, seq_len)),
                  jnp.int32)
  jax.block_until_ready(fwd(state, x))
  best = math.inf
  for _ in range(max(1, repeats)):
    t = time.perf_counter()
    jax.block_until_ready(fwd(state, x))
    best = min(best, time.perf_counter() - t)
  return batch * seq_len / best


def efficiency_rows(configs: dict, context_lens=(2048, 8192, 32768), chunk: int = 64,
                    measure: bool = False, batch: int = 2, seq_len: int = 512) -> list[dict]:
  """One row per (name, context length) of {name: ModelConfig or HybridLM}: FLOPs per token, cache
  MiB and, with `measure`, measured forward tokens/s at [batch, seq_len]."""
  rows = []
  for name, cfg in configs.items():
    tps = measure_tokens_per_s(cfg, batch, seq_len) if measure else None
    cfg = cfg.config if isinstance(cfg, HybridLM) else cfg
    for L in context_lens:
      c = model_costs(cfg, L, chunk)
      rows.append(dict(model=name, context_len=L, params_M=c["params"] / 1e6,
                       mixing_MFLOPs_per_token=c["mixing_flops"] / 1e6,
                       decode_mixing_MFLOPs=c["decode_mixing_flops"] / 1e6,
                       projection_MFLOPs=c["projection_flops"] / 1e6,
                       cache_MiB=c["cache_bytes"] / 2**20, tokens_per_s=tps))
  return rows
