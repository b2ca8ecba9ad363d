"""HybridLM: a decoder of pre-norm blocks whose token mixer is a linear-attention layer or softmax
attention, placed by a ratio.

    x = embed(tokens)
    for each layer:  x = x + mixer(RMSNorm(x));  x = x + SwiGLU(RMSNorm(x))
    logits = head(RMSNorm(x))                          (float32; head tied to the embedding or not)

`block="rwkv6"` makes the blocks fla's RWKV-6 blocks: LayerNorms (with biases) for the RMSNorms,
RWKV-6 channel mixing for SwiGLU, and x = LayerNorm(embed(tokens)) first.

`attn_ratio` "r:1" = r linear layers then one attention layer, repeated (24 layers at "3:1": attention
at 3, 7, ..., 23); "pure" = no attention; "transformer" / "attention" = every layer attention (then
the model is exactly a Llama); `attn_layers` (explicit indices) overrides the ratio.

Packed rows: `segment_ids` [B, L] (a change of id starts a new sequence) make the linear mixers
reset their state at each boundary (each row runs as one cu_seqlens sequence pack of at most
max_segments sequences; more than that under jit turns the logits into NaN: raise
`max_segments`), the short convolutions stop at boundaries, attention masks across them, and RoPE
positions restart at 0 unless `positions` are given.

The fields are `ModelConfig`'s (config.py), the placement of attention placement.py's; the blocks
run through compile.py's `call_shared` / `scan_blocks`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from lineax_lm import sharding
from lineax_lm.layers import Context, Packing, RMSNorm, SwiGLU, build_mixer
from lineax_lm.layers.channel_mix import RWKV6ChannelMix
from lineax_lm.layers.common import (LayerNorm, cu_seqlens_from_starts, param, prompt_packing,
                                     recomputed_between_dots)
from lineax_lm.models import generate as generation
from lineax_lm.models.compile import call_shared, scan_blocks
from lineax_lm.models.config import ModelConfig
from pallas_kernels.common.varlen import sequence_index


def segment_ids_from_cu_seqlens(cu_seqlens, length: int):
  """FlashAttention-style offsets [0, ..., T] of sequences packed in one row -> segment ids [1, T]."""
  return sequence_index(jnp.asarray(cu_seqlens, jnp.int32), jnp.arange(length))[None]


def make_packing(segment_ids, max_segments: int):
  """segment_ids [B, L] -> (Packing, positions within each sequence [B, L], overflow flag).

  Each row's cu_seqlens has exactly the largest per-row number of sequences + 1 entries when
  `segment_ids` is concrete, and max_segments + 1 under jit (padded with L: empty sequences);
  `overflow` says that a row held more sequences than that."""
  B, L = segment_ids.shape
  seg = jnp.asarray(segment_ids)
  starts = jnp.concatenate([jnp.ones((B, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  if isinstance(segment_ids, jax.core.Tracer):
    n = max_segments
  else:  # concrete: the exact number of sequences of the fullest row
    n = int(np.max(np.sum(np.asarray(starts), axis=1)))
  cu_seqlens = jax.vmap(lambda row: cu_seqlens_from_starts(row, n))(starts)
  reset_ids = (jnp.cumsum(starts.reshape(-1), dtype=jnp.int32) - 1).reshape(B, L)
  t = jnp.arange(L, dtype=jnp.int32)
  positions = t - lax.cummax(jnp.where(starts, t, 0), axis=1)
  return Packing(cu_seqlens, reset_ids), positions, jnp.any(jnp.sum(starts, axis=1) > n)


def make_norm(config: ModelConfig, spec, rngs):
  """The block kind's norm: RMSNorm, or LayerNorm with a bias for RWKV-6 blocks."""
  norm = LayerNorm if config.block == "rwkv6" else RMSNorm
  return norm(config.hidden, config.norm_eps, spec, rngs)


class Block(nnx.Module):
  """Pre-norm block: x + mixer(attn_norm(x)), then + mlp(mlp_norm(x)) (config.block: SwiGLU, or
  RWKV-6 channel mixing, whose token shift has a decode state: the block's cache is then
  {"mixer": the mixer's cache, "mlp": [B, 1, D]}; otherwise the mixer's cache)."""

  def __init__(self, config: ModelConfig, layer_idx: int, rngs: nnx.Rngs):
    self.spec = spec = config.layer_spec()
    self.is_attention = layer_idx in config.attention_indices
    name, mcfg = (("attention", config.attention_config()) if self.is_attention
                  else (config.mixer, config.linear_mixer_config()))
    self.attn_norm = make_norm(config, spec, rngs)
    self.mixer = build_mixer(name, mcfg, spec, rngs)
    self.mlp_norm = make_norm(config, spec, rngs)
    width = config.mlp_width(self.is_attention)
    self.channel_mix = config.block == "rwkv6"
    self.mlp = (RWKV6ChannelMix if self.channel_mix else SwiGLU)(config.hidden, width, spec, rngs)

  def __call__(self, x, cache, ctx: Context, lower_bound=None):
    kw = {"lower_bound": lower_bound} if getattr(self.mixer, "uses_lower_bound", False) else {}
    mixer_cache = cache["mixer"] if self.channel_mix and cache is not None else cache
    h, mixer_cache = self.mixer(self.attn_norm(x), mixer_cache, ctx, **kw)
    x = x + h
    if not self.channel_mix:
      # The normalised input of the MLP's projections is recomputed in the backward from x, which
      # is kept anyway (the norm's own backward needs it): one [B, L, D] activation less per layer.
      return x + recomputed_between_dots(self._mlp)(x), mixer_cache
    shift = None if cache is None else cache["mlp"]
    reset_ids = None if ctx.packing is None else ctx.packing.reset_ids
    y, shift = recomputed_between_dots(self._channel_mix)(x, shift, reset_ids)
    return x + y, None if cache is None else {"mixer": mixer_cache, "mlp": shift}

  def _mlp(self, x):
    return self.mlp(self.mlp_norm(x))

  def _channel_mix(self, x, shift, reset_ids):
    return self.mlp(self.mlp_norm(x), shift, reset_ids)

  def init_cache(self, batch: int, max_len: int, dtype=None):
    cache = self.mixer.init_cache(batch, max_len, dtype)
    if not self.channel_mix:
      return cache
    return {"mixer": cache, "mlp": jnp.zeros((batch, 1, self.spec.hidden), dtype or self.spec.dtype)}

  def cache_bytes(self, context_len: int, dtype=None) -> int:
    out = self.mixer.cache_bytes(context_len, dtype)
    if self.channel_mix:  # the channel mixing's shift state: one input
      out += self.spec.hidden * jnp.dtype(dtype or self.spec.dtype).itemsize
    return out


# Module-level layer functions for call_shared and scan_blocks (their identity is the trace key).
def _block_forward(block, x, cache, ctx, lower_bound):
  return block(x, cache, ctx, lower_bound)


def _block_training_forward(block, x, ctx, lower_bound=None):
  return block(x, None, ctx, lower_bound)[0]


class HybridLM(nnx.Module):
  """inputs [B, L] int32 -> logits [B, L, vocab] float32 (`hidden`: the states before the head)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, block=Block):
    self.config = config
    spec = config.layer_spec()
    normal = nnx.initializers.normal(config.init_std)
    self.embed = nnx.Embed(
        config.vocab_size, config.hidden, dtype=spec.dtype, param_dtype=spec.param_dtype, rngs=rngs,
        embedding_init=nnx.with_partitioning(normal, ("vocab", "embed"), eager_sharding=False))
    # RWKV-6 blocks: fla's LayerNorm before layer 0 (its `pre_norm`), which normalises the
    # residual stream itself
    self.embed_norm = make_norm(config, spec, rngs) if config.block == "rwkv6" else None
    self.blocks = nnx.List([block(config, i, rngs) for i in range(config.num_layers)])
    self.norm = make_norm(config, spec, rngs)
    self.lm_head = None if config.tie_embeddings else param(
        rngs, normal, (config.hidden, config.vocab_size), ("embed", "vocab"), spec.param_dtype)
    widths = {b.mixer.forget_dim for b in self.blocks if getattr(b.mixer, "uses_lower_bound", False)}
    # HGRN / HGRN-2: forget-gate lower bounds, softmax over layers then cumsum (grow with depth).
    self.lower_bounds = param(rngs, nnx.initializers.zeros, (config.num_layers, widths.pop()),
                              ("layers", "heads"), spec.param_dtype) if widths else None

  def __call__(self, inputs, segment_ids=None, positions=None):
    """inputs: [B, L] int32; segment_ids: [B, L] (packed rows); positions: [B, L] RoPE positions."""
    return self._logits(self._forward(inputs, segment_ids, positions, None)[0])

  def hidden(self, inputs, segment_ids=None, positions=None):
    """What `__call__` feeds the head: (final normalised hidden states [B, L, D] in the activation
    dtype, head [D, vocab] in the activation dtype), for losses that apply the head themselves
    chunk by chunk (lineax_lm.train.losses) instead of materialising the float32 logits. A packed
    row overflow makes the hidden states NaN, as it makes the logits NaN."""
    x, _ = self._forward(inputs, segment_ids, positions, None)
    return x, self._head().astype(x.dtype)

  def step(self, inputs, cache, last_only: bool = False, fresh: bool = False, length=None):
    """Prefill (L > 1) or decode (L == 1) `inputs` [B, L] after the cache's `pos` tokens.
    Returns (logits [B, L, vocab] float32, new cache); `last_only`: the last position's logits
    only, [B, 1, vocab] (a prefill that only samples the next token never forms the others);
    `fresh`: the cache is `init_cache`'s, no token in it yet, so the prompt's attention is causal
    within the prompt (the flash kernels) instead of masked over every slot of the cache.

    `length` (with `fresh`; an int32 scalar, traced or not, 1 <= length <= L): only the first
    `length` tokens of every row are the prompt, the rest pads it to a compiled width L, so that
    prompts of any length up to L share one program. The new cache then holds the prompt alone
    (pos = length; attention slots from `length` on are overwritten by the decode steps before
    they are read) and `last_only` gives the logits at position length - 1."""
    if length is not None and not fresh:
      raise ValueError("`length` pads a prompt into a fresh cache: it needs fresh=True")
    x, cache = self._forward(inputs, None, None, cache, fresh, length)
    if not last_only:
      return self._logits(x), cache
    last = x[:, -1:] if length is None else lax.dynamic_slice_in_dim(x, length - 1, 1, axis=1)
    return self._logits(last), cache

  def init_cache(self, batch: int, max_len: int, dtype=None):
    """Zero cache for `batch` sequences of up to `max_len` tokens: {"pos": int32 scalar,
    "layers": [one cache per layer]} (linear layers: recurrent + conv states; attention: KV)."""
    return {"pos": jnp.zeros((), jnp.int32),
            "layers": [b.init_cache(batch, max_len, dtype) for b in self.blocks]}

  def cache_bytes(self, context_len: int, dtype=None) -> dict:
    """Bytes one sequence's cache needs at `context_len` tokens, per layer kind, computed from the
    layer dimensions (not from a cache)."""
    out = {"attention": 0, "linear": 0}
    for b in self.blocks:
      out["attention" if b.is_attention else "linear"] += b.cache_bytes(context_len, dtype)
    out["total"] = out["attention"] + out["linear"]
    return out

  def generate(self, prompt_ids, max_new_tokens: int, **sampling):
    """See lineax_lm.models.generate.generate."""
    return generation.generate(self, prompt_ids, max_new_tokens, **sampling)

  def _lower_bound_rows(self):
    """HGRN's per-layer forget-gate lower bounds [num_layers, width], rising with depth from exactly
    0 at layer 0; None for models without them."""
    if self.lower_bounds is None:
      return None
    lb = jax.nn.softmax(self.lower_bounds[...].astype(jnp.float32), axis=0)
    return jnp.cumsum(lb, axis=0) - lb[0]

  def _lower_bounds(self):
    rows = self._lower_bound_rows()
    if rows is None:
      return [None] * len(self.blocks)
    return [None] + [rows[i] for i in range(1, len(self.blocks))]  # layer 0's bound is 0: none

  def _scan_period(self):
    """The number of blocks per repeat of the layer pattern when the forward can scan over the
    repeats (config.scan_layers, at least two repeats), else None."""
    kinds = [b.is_attention for b in self.blocks]
    if not self.config.scan_layers:
      return None
    n = len(kinds)
    for period in range(1, n // 2 + 1):
      if n % period == 0 and all(kinds[i] == kinds[i % period] for i in range(n)):
        return period
    return None

  def _head(self):
    return self.embed.embedding[...].T if self.lm_head is None else self.lm_head[...]

  def _logits(self, x):
    return jnp.einsum("bld,dv->blv", x, self._head().astype(x.dtype),
                      preferred_element_type=jnp.float32)

  def _forward(self, inputs, segment_ids, positions, cache, fresh: bool = False, length=None):
    """-> (final normalised hidden states [B, L, D], new cache or None); `length`: step's."""
    config = self.config
    if inputs.ndim != 2:
      raise ValueError(f"`inputs` must be [B, L] token ids; got shape {inputs.shape}")
    B, L = inputs.shape
    packing, overflow = None, None
    if segment_ids is not None:
      if tuple(segment_ids.shape) != (B, L):
        raise ValueError(f"`segment_ids` must have the shape of `inputs` {(B, L)}; "
                         f"got {segment_ids.shape}")
      packing, seg_positions, overflow = make_packing(segment_ids, config.max_segments)
      positions = seg_positions if positions is None else positions
    if length is not None:  # each row: the prompt, then its padding (Packing)
      packing = prompt_packing(length, B, L)
    start = None if cache is None or fresh else cache["pos"]  # None: from position 0
    if positions is None:
      positions = jnp.arange(L, dtype=jnp.int32) + (0 if start is None else start)
    ctx = Context(jnp.broadcast_to(positions, (B, L)).astype(jnp.int32), packing, start)

    remat = config.remat if config.remat != "none" and cache is None else None
    # a backward only follows training's forward. Under remat the backward recomputes each layer's
    # forward and then forms the same states again: kept by that forward instead, they cost no
    # memory the backward's own pass would not
    keep_states = (config.keep_states or remat is not None) and cache is None
    x = self.embed(inputs)
    if self.embed_norm is not None:
      x = self.embed_norm(x)
    if cache is None:  # training: the residual stream in the batch's layout (a cache keeps T whole)
      x = sharding.constrain_rows(x)
    layer_caches = []
    period = self._scan_period() if cache is None else None
    if period is not None:
      x = scan_blocks(_block_training_forward, list(self.blocks), period, x, ctx,
                      per_layer=self._lower_bound_rows(), remat=remat, keep_states=keep_states)
    else:
      for i, (block, lb) in enumerate(zip(self.blocks, self._lower_bounds())):
        x, layer_cache = call_shared(_block_forward, block, x,
                                     None if cache is None else cache["layers"][i], ctx, lb,
                                     remat=remat, keep_states=keep_states)
        if cache is None:
          x = sharding.constrain_rows(x)
        layer_caches.append(layer_cache)
    x = self.norm(x)
    if overflow is not None:  # NaN reaches the logits (and any loss on them) through the head
      x = jnp.where(overflow, jnp.nan, x)
    read = L if length is None else jnp.asarray(length, jnp.int32)
    new_cache = None if cache is None else {"pos": cache["pos"] + read, "layers": layer_caches}
    return x, new_cache


class _ShapeOnlyKeys:
  """Stands in for nnx.Rngs under nnx.eval_shape, where only shapes matter: drawing from nnx.Rngs
  there makes flax 0.12 format an error message per draw (cost quadratic in the model size)."""

  def params(self):
    return jax.random.key(0)


def _abstract(build):
  """build() -> module, with jax.ShapeDtypeStruct parameters. Unlike nnx.eval_shape, this works
  under an active mesh (whose axes are not the parameters' logical axis names)."""
  graphdef, state = jax.eval_shape(lambda: nnx.split(build()))
  return nnx.merge(graphdef, state)


def abstract_model(config: ModelConfig) -> HybridLM:
  """The model with jax.ShapeDtypeStruct parameters (nothing allocated): for counting parameters and
  sizing caches of large configs."""
  return _abstract(lambda: HybridLM(config, _ShapeOnlyKeys()))


def abstract_model_one_block_per_kind(config: ModelConfig) -> HybridLM:
  """`abstract_model` whose layers share one Block per kind (linear mixer, attention): a Block's
  parameters depend on its layer only through that kind, so this model has every parameter shape of
  the full one, built from two blocks instead of `num_layers`. Its state holds each shared block
  once, under the first layer of its kind."""
  attention = set(config.attention_indices)
  built = {}

  def block_of_kind(config, layer_idx, rngs):
    kind = layer_idx in attention
    if kind not in built:
      built[kind] = Block(config, layer_idx, rngs)
    return built[kind]

  return _abstract(lambda: HybridLM(config, _ShapeOnlyKeys(), block=block_of_kind))


def _abstract_block(config: ModelConfig, layer_idx: int, rngs) -> Block:
  return _abstract(lambda: Block(config, layer_idx, _ShapeOnlyKeys()))


def init_params(config: ModelConfig, seed, shardings=None) -> nnx.State:
  """Random parameters of HybridLM(config) as its nnx.Param state (what
  `nnx.state(HybridLM(config, nnx.Rngs(seed)), nnx.Param)` holds, from other draws of the seed),
  built one block at a time: one compiled program per kind of block (linear mixer, attention),
  called once per layer, and one for the embedding, final norm and head. A single program for a
  24-layer stack took 3 minutes to compile on the H200 (475M parameters); the same draws do not
  depend on the mesh. seed: int or uint32 scalar; shardings: matching nnx.State of shardings."""
  key = jax.random.key(seed)
  state = nnx.state(abstract_model(config), nnx.Param)
  out_sh = nnx.to_pure_dict(shardings) if shardings is not None else None
  top = _init_program(config, None, *_cache_key(out_sh and {k: v for k, v in out_sh.items() if k != "blocks"}))
  params = top(jax.random.fold_in(key, config.num_layers))
  blocks, first_of_kind = {}, {}
  for i in range(config.num_layers):
    # a block's parameters do not depend on its index, only on its kind: one program per kind
    first = first_of_kind.setdefault(i in config.attention_indices, i)
    program = _init_program(config, first, *_cache_key(out_sh and out_sh["blocks"][i]))
    blocks[i] = program(jax.random.fold_in(key, i))
  nnx.replace_by_pure_dict(state, params | {"blocks": blocks})
  return state


def _cache_key(shardings) -> tuple:
  """A pytree of shardings (or None) as hashable arguments: its leaves and its structure."""
  leaves, treedef = jax.tree_util.tree_flatten(shardings)
  return tuple(leaves), treedef


@functools.lru_cache(maxsize=32)
def _init_program(config: ModelConfig, layer: int | None, sharding_leaves: tuple, sharding_def):
  """The jitted init of block `layer`'s parameters, or (None) of the rest (embedding, final norm,
  head), kept per config and output shardings (`_cache_key`'s): a run that starts again in the
  same process (a resumed run, a population's members, the next notebook cell) reuses the compiled
  program."""
  if layer is None:
    def init(key):
      params = nnx.to_pure_dict(nnx.state(HybridLM(config, nnx.Rngs(key), block=_abstract_block), nnx.Param))
      del params["blocks"]
      return params
  else:
    def init(key):
      return nnx.to_pure_dict(nnx.state(Block(config, layer, nnx.Rngs(key)), nnx.Param))
  return jax.jit(init, out_shardings=jax.tree_util.tree_unflatten(sharding_def, sharding_leaves))


def init_model(config: ModelConfig, seed) -> HybridLM:
  """A randomly initialised HybridLM built from `init_params` (block-wise compiled init)."""
  return nnx.merge(nnx.graphdef(abstract_model(config)), init_params(config, seed))
