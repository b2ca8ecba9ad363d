"""The base class of the linear (recurrent) mixers: short convolutions, cache layout and size.

A linear mixer's cache is {"state": S, "conv": {name: [B, W - 1, C]}}: S is the op's float32
recurrent state ([B, H, K, V] for most; a tuple for mLSTM), the conv states hold the last W - 1
inputs of each short convolution. Its size does not grow with the context.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from lineax_lm.layers.common import (F32, Context, LayerSpec, GatedRMSNorm, MixerConfig, RMSNorm,
                                     ShortConv, dense, merge_heads, residual_dense,
                                     split_heads)


class ShortConvs:
  """The short convolutions of a layer (the linear mixers, and attention with `use_short_conv`):
  `_make_conv` creates `<name>_conv1d` from `self.cfg` / `self.spec`, `short_conv` runs them, and
  `conv_cache` / `conv_cache_bytes` are their decoding state {name: [B, W - 1, C]}."""

  conv_names: tuple = ()   # layers with a `<name>_conv1d` ShortConv
  conv_states: tuple = ()  # (name, rows, channels) of every cached input window

  def _make_conv(self, name: str, channels: int, rngs, activation: str | None = "silu",
                 width: int | None = None, bias: bool | None = None):
    cfg = self.cfg
    conv = ShortConv(channels, width or cfg.conv_size, self.spec, rngs,
                     bias=cfg.conv_bias if bias is None else bias, activation=activation)
    setattr(self, f"{name}_conv1d", conv)
    self.conv_names = self.conv_names + (name,)
    self.conv_states = self.conv_states + ((name, conv.width - 1, channels),)
    return conv

  def short_conv(self, inputs: dict, cache, ctx: Context | None, fallback=jax.nn.silu):
    """Runs each named input [B, L, C] through its short convolution (with the cached conv state when
    decoding), or through `fallback` when the layer has no convolutions. Returns (outputs in the
    order of `inputs`, new conv states {name: [B, W - 1, C]})."""
    if not self.conv_names:
      return tuple(x if fallback is None else fallback(x) for x in inputs.values()), {}
    reset_ids = reset_ids_of(ctx)
    outs, states = [], {}
    for name, x in inputs.items():
      conv_state = None if cache is None else cache["conv"][name]
      y, states[name] = getattr(self, f"{name}_conv1d")(x, conv_state, reset_ids)
      outs.append(y)
    return tuple(outs), states

  def conv_cache(self, batch: int, dtype) -> dict:
    return {n: jnp.zeros((batch, rows, c), dtype) for n, rows, c in self.conv_states}

  def conv_cache_bytes(self, itemsize: int) -> int:
    return sum(rows * c for _, rows, c in self.conv_states) * itemsize


class LinearMixer(ShortConvs, nnx.Module):
  """Subclasses call `_setup`, create their convolutions with `_make_conv` and set
  `self.state_shapes`, a tuple of per-sequence recurrent state shapes (one per state array)."""

  uses_lower_bound = False  # HGRN / HGRN-2 take a lower bound on the forget gate from the model
  state_shapes: tuple = ()

  def _setup(self, cfg: MixerConfig, spec: LayerSpec):
    self.cfg, self.spec = cfg, spec

  def _make_qkv(self, num_heads: int, key_dim: int, value_dim: int, rngs,
                qk_conv_act: str | None = "silu"):
    """q/k/v projections D -> (key_dim, key_dim, value_dim) split into `num_heads` heads and, with
    `use_short_conv`, their short convolutions (q and k with `qk_conv_act`, v with SiLU)."""
    if key_dim % num_heads or value_dim % num_heads:
      raise ValueError(f"{type(self).__name__}: key dim {key_dim} and value dim {value_dim} must be "
                       f"divisible by `num_heads` = {num_heads}")
    D, spec = self.spec.hidden, self.spec
    self.key_dim, self.value_dim = key_dim, value_dim
    self.head_k_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
    self.q_proj = dense(D, key_dim, ("embed", "heads"), spec, rngs)
    self.k_proj = dense(D, key_dim, ("embed", "heads"), spec, rngs)
    self.v_proj = dense(D, value_dim, ("embed", "heads"), spec, rngs)
    if self.cfg.use_short_conv:
      self._make_conv("q", key_dim, rngs, qk_conv_act)
      self._make_conv("k", key_dim, rngs, qk_conv_act)
      self._make_conv("v", value_dim, rngs, "silu")
    self.state_shapes = ((num_heads, self.head_k_dim, self.head_v_dim),)

  def qkv(self, x, cache, ctx: Context | None, fallback=None):
    """x [B, L, D] -> q, k [B, L, H, K], v [B, L, H, V] through the projections and the short
    convolutions (`fallback` on each without them), and the new conv states."""
    (q, k, v), conv = self.short_conv({"q": self.q_proj(x), "k": self.k_proj(x), "v": self.v_proj(x)},
                                      cache, ctx, fallback)
    hk, hv = self.head_k_dim, self.head_v_dim
    return split_heads(q, hk), split_heads(k, hk), split_heads(v, hv), conv

  def _make_output(self, value_dim: int, head_v_dim: int, rngs, *, gate: bool = True,
                   activation: str = "swish", g_proj=None):
    """o_norm (per-head RMSNorm, gated by g_proj(x) when `gate`), g_proj and o_proj [value_dim -> D]."""
    D, spec, eps = self.spec.hidden, self.spec, self.cfg.norm_eps
    self.out_head_dim = head_v_dim
    if gate:
      self.g_proj = g_proj or dense(D, value_dim, ("embed", "heads"), spec, rngs)
      self.o_norm = GatedRMSNorm(head_v_dim, eps, spec, rngs, activation=activation)
    else:
      self.g_proj, self.o_norm = None, RMSNorm(head_v_dim, eps, spec, rngs)
    self.o_proj = residual_dense(value_dim, D, ("heads", "embed"), spec, rngs)

  def output(self, o, x):
    """o: [B, L, H, V] op output, x: [B, L, D] layer input -> [B, L, D]."""
    if self.g_proj is not None:
      o = self.o_norm(o, split_heads(self.g_proj(x), self.out_head_dim))
    else:
      o = self.o_norm(o)
    return self.o_proj(merge_heads(o))

  @staticmethod
  def decoding(x, cache) -> bool:
    """One new token with a cache: the fused_recurrent op; otherwise the chunk op."""
    return cache is not None and x.shape[1] == 1

  @staticmethod
  def state_of(cache):
    return None if cache is None else cache["state"]

  @staticmethod
  def new_cache(cache, state, conv: dict):
    return None if cache is None else {"state": state, "conv": conv}

  def init_cache(self, batch: int, max_len: int, dtype=None):
    """Zero cache for `batch` sequences; its size does not depend on `max_len`."""
    del max_len
    dtype = dtype or self.spec.dtype
    states = tuple(jnp.zeros((batch, *s), F32) for s in self.state_shapes)
    return {"state": states[0] if len(states) == 1 else states, "conv": self.conv_cache(batch, dtype)}

  def cache_bytes(self, context_len: int, dtype=None) -> int:
    """Bytes of one sequence's cache, computed from the layer's dimensions: float32 recurrent state
    plus (W - 1) * C conv inputs per convolution; constant in `context_len`."""
    del context_len
    itemsize = jnp.dtype(dtype or self.spec.dtype).itemsize
    return sum(math.prod(s) for s in self.state_shapes) * 4 + self.conv_cache_bytes(itemsize)


def reset_ids_of(ctx: Context | None):
  return None if ctx is None or ctx.packing is None else ctx.packing.reset_ids


def ctx_or_default(x, ctx: Context | None) -> Context:
  """A context with positions 0..L-1 when the caller gave none (layer-level use)."""
  if ctx is not None:
    return ctx
  B, L = x.shape[:2]
  return Context(jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L)))
