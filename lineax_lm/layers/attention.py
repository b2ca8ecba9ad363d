"""Softmax attention exactly as HF Llama's: q/k/v/o projections without bias, GQA, RoPE (rotate-half
layout, theta from the config), optional sliding window, `jax.nn.dot_product_attention`
(`attn_impl`: None lets JAX choose, "xla", "cudnn"), and a KV cache for decode. Under a mesh that
splits the sequence over `context` (training), keys and values are gathered from every slice
(`context_parallel_attention`).

`use_short_conv` (off by default, so the layer is Llama's) puts a causal depthwise convolution over
the last `conv_size` tokens on q, k and v, as the linear mixers have (and as Zoology's MQAR models
put one before attention): a key then carries the tokens just before it, which plain attention
must first learn a previous-token head for. The convolutions start as the identity (the current
token's tap 1, the others small), so the layer starts as plain attention.

Cache of one layer: {"k": [B, S, Hkv, Dh], "v": [B, S, Hkv, Dh]} in the activation dtype, S = the
maximum length, and with `use_short_conv` "conv": {"q", "k", "v": [B, conv_size - 1, C]} (the
convolutions' last inputs); the model says where the new tokens go (`Context.cache_index`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lineax_lm import sharding
from lineax_lm.layers.base import ShortConvs, ctx_or_default
from lineax_lm.layers.common import (Context, LayerSpec, MixerConfig, dense, merge_heads,
                                     residual_dense, rope, split_heads)


@dataclasses.dataclass(frozen=True)
class AttentionConfig(MixerConfig):
  num_heads: int = 16
  num_kv_heads: int | None = None   # None: num_heads (no GQA)
  head_dim: int | None = None       # None: hidden // num_heads
  rope_theta: float = 10000.0
  window: int | None = None         # sliding window: a query sees itself and window - 1 earlier keys
  qkv_bias: bool = False
  attn_impl: str | None = None      # jax.nn.dot_product_attention `implementation`
  use_short_conv: bool = False


def attention_mask(q_pos, k_pos, window=None, q_ids=None, k_ids=None):
  """Boolean [B, 1, Lq, Lk]: causal, within the window, and (packed rows) within one sequence.
  q_pos: [B, Lq] / [Lq]; k_pos: [B, Lk] / [Lk] positions in the row (or cache slots)."""
  q_pos, k_pos = jnp.atleast_2d(q_pos), jnp.atleast_2d(k_pos)
  mask = k_pos[:, None, :] <= q_pos[:, :, None]
  if window is not None:
    mask &= k_pos[:, None, :] > q_pos[:, :, None] - window
  if q_ids is not None:
    mask &= k_ids[:, None, :] == q_ids[:, :, None]
  return mask[:, None]


def context_parallel_attention(q, k, v, ids=None, window=None, implementation=None):
  """Causal attention of q [B, L, H, Dh] over k, v [B, L, Hkv, Dh] with L split over the mesh's
  `context` axis: each device all-gathers every slice's keys and values (and segment ids `ids`
  [B, L] of packed rows) and attends its own queries to the whole sequence, the causal and window
  mask offset by its slice's start. RoPE is already applied (on global positions), so only the mask
  needs the offset. Returns o [B, L, H, Dh], split like q.

  All-gather rather than a ring: at 2-8 devices the gathered K/V are a few times one slice's
  activations (GQA keeps them small), the gather is one collective XLA overlaps with the projections,
  and attention stays one fused call with a mask. A ring passes K/V in c - 1 sequential steps, each
  a partial softmax merged online, and pays off when the whole sequence's K/V would not fit or at
  many more devices."""
  def local(q, k, v, ids):
    length = q.shape[1]
    keys = sharding.gather_sequence(k)
    q_index = sharding.slice_start(length) + jnp.arange(length)
    k_ids = None if ids is None else sharding.gather_sequence(ids)
    mask = attention_mask(q_index, jnp.arange(keys.shape[1]), window, ids, k_ids)
    return jax.nn.dot_product_attention(q, keys, sharding.gather_sequence(v), mask=mask,
                                        implementation=implementation)
  return sharding.context_map(local, (q, k, v, ids), ("time",) * 4, k.shape[2])


class Attention(ShortConvs, nnx.Module):
  """Llama attention. x: [B, L, D] -> ([B, L, D], new KV cache or None)."""

  def __init__(self, cfg: AttentionConfig, spec: LayerSpec, rngs: nnx.Rngs):
    D, H = spec.hidden, cfg.num_heads
    Hkv = cfg.num_kv_heads or H
    if H % Hkv:
      raise ValueError(f"`num_heads` {H} must be a multiple of `num_kv_heads` {Hkv}")
    self.head_dim = cfg.head_dim or D // H
    if self.head_dim % 2:
      raise ValueError(f"RoPE needs an even head dim; got {self.head_dim}")
    if cfg.window is not None and cfg.window < 1:
      raise ValueError(f"`window` must be >= 1 or None; got {cfg.window}")
    self.cfg, self.spec, self.num_kv_heads = cfg, spec, Hkv
    kv = Hkv * self.head_dim
    self.q_proj = dense(D, H * self.head_dim, ("embed", "heads"), spec, rngs, bias=cfg.qkv_bias)
    self.k_proj = dense(D, kv, ("embed", "kv_heads"), spec, rngs, bias=cfg.qkv_bias)
    self.v_proj = dense(D, kv, ("embed", "kv_heads"), spec, rngs, bias=cfg.qkv_bias)
    self.o_proj = residual_dense(H * self.head_dim, D, ("heads", "embed"), spec, rngs)
    if cfg.use_short_conv:
      for name, channels in (("q", H * self.head_dim), ("k", kv), ("v", kv)):
        conv = self._make_conv(name, channels, rngs, activation=None)
        conv.weight[...] = conv.weight[...].at[-1].add(1.0)  # the current token's tap: identity start

  def __call__(self, x, cache=None, ctx: Context | None = None):
    cfg = self.cfg
    ctx = ctx_or_default(x, ctx)
    (q, k, v), conv = self.short_conv({"q": self.q_proj(x), "k": self.k_proj(x), "v": self.v_proj(x)},
                                      cache, ctx, fallback=None)
    q = rope(split_heads(q, self.head_dim), ctx.positions, cfg.rope_theta)
    k = rope(split_heads(k, self.head_dim), ctx.positions, cfg.rope_theta)
    v = split_heads(v, self.head_dim)
    L = x.shape[1]
    if cache is not None:
      if ctx.packing is not None:
        raise ValueError("packed inputs (`segment_ids`) cannot be combined with a decode cache")
      start = jnp.zeros((), jnp.int32) if ctx.cache_index is None else ctx.cache_index
      idx = (0, start, 0, 0)
      cache = {"k": lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), idx),
               "v": lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), idx),
               **({"conv": conv} if self.conv_names else {})}
      k, v = cache["k"].astype(q.dtype), cache["v"].astype(q.dtype)
      mask = attention_mask(start + jnp.arange(L), jnp.arange(k.shape[1]), cfg.window)
      o = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=cfg.attn_impl)
    elif sharding.context_axis(L):
      ids = None if ctx.packing is None else ctx.packing.reset_ids
      o = context_parallel_attention(q, k, v, ids, cfg.window, cfg.attn_impl)
    elif ctx.packing is not None or cfg.window is not None:
      ids = None if ctx.packing is None else ctx.packing.reset_ids
      t = jnp.arange(L)
      mask = attention_mask(t, t, cfg.window, ids, ids)
      o = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=cfg.attn_impl)
    else:
      o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=cfg.attn_impl)
    return self.o_proj(merge_heads(o)), cache

  def init_cache(self, batch: int, max_len: int, dtype=None):
    shape = (batch, max_len, self.num_kv_heads, self.head_dim)
    dtype = dtype or self.spec.dtype
    cache = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    if self.conv_names:
      cache["conv"] = self.conv_cache(batch, dtype)
    return cache

  def cache_bytes(self, context_len: int, dtype=None) -> int:
    """2 * kv_heads * head_dim * bytes per token, for `context_len` tokens of one sequence (plus the
    convolutions' (conv_size - 1) * channels inputs with `use_short_conv`)."""
    itemsize = jnp.dtype(dtype or self.spec.dtype).itemsize
    return (2 * self.num_kv_heads * self.head_dim * context_len * itemsize
            + self.conv_cache_bytes(itemsize))
