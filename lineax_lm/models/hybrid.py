"""HybridLM: a decoder of pre-norm blocks whose token mixer is a linear-attention layer or softmax
attention, placed by a ratio.

    x = embed(tokens)
    for each layer:  x = x + mixer(RMSNorm(x));  x = x + SwiGLU(RMSNorm(x))
    logits = head(RMSNorm(x))                          (float32; head tied to the embedding or not)

`attn_ratio` "r:1" = r linear layers then one attention layer, repeated (24 layers at "3:1": attention
at 3, 7, ..., 23); "pure" = no attention; "transformer" / "attention" = every layer attention (then
the model is exactly a Llama); `attn_layers` (explicit indices) overrides the ratio.

Packed rows: `segment_ids` [B, L] (a change of id starts a new sequence) make the linear mixers
reset their state at each boundary (each row runs as one cu_seqlens sequence pack of at most
max_segments sequences; more than that under jit turns the logits into NaN: raise
`max_segments`), the short convolutions stop at boundaries, attention masks across them, and RoPE
positions restart at 0 unless `positions` are given.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util
from jax import lax

from lineax_lm.layers import (Context, LayerSpec, Packing, RMSNorm, SwiGLU, build_mixer,
                              mixer_config, mlp_width)
from lineax_lm.layers.common import (INIT_STD, cu_seqlens_from_starts, param,
                                     recomputed_between_dots)
from lineax_lm.models import generate as generation
from pallas_kernels.common.varlen import sequence_index

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


RESIDUAL_INITS = ("normal", "rescale")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int = 32000
  num_layers: int = 24
  hidden: int = 1024
  heads: int = 16                          # attention heads
  kv_heads: int | None = None              # attention key/value heads (GQA); None = heads
  head_dim: int | None = None              # attention head dim; None = hidden // heads
  mlp_hidden: int | None = None            # None: fla's rule, 8/3 hidden rounded up to 256
  linear_mlp_hidden: int | None = None     # MLP width of the linear-mixer blocks (default mlp_hidden)
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

  def __post_init__(self):
    items = self.mixer_cfg.items() if isinstance(self.mixer_cfg, Mapping) else self.mixer_cfg
    object.__setattr__(self, "mixer_cfg", tuple(sorted(dict(items).items())))
    if self.attn_layers is not None:
      object.__setattr__(self, "attn_layers", tuple(int(i) for i in self.attn_layers))
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"`remat` must be one of {sorted(REMAT_POLICIES)}; got {self.remat!r}")
    if self.residual_init not in RESIDUAL_INITS:
      raise ValueError(f"`residual_init` must be one of {RESIDUAL_INITS}; got {self.residual_init!r}")
    # The command line's range table (it imports this module: imported here, not at the top).
    from lineax_lm.train.validation import check_model_config
    check_model_config(self)
    attention_layers(self.num_layers, self.attn_ratio, self.attn_layers)  # validates

  @classmethod
  def from_config(cls, config) -> "ModelConfig":
    """From an ml_collections ConfigDict (or any mapping) with a subset of the fields. A `preset`
    key naming one of lineax_lm.models.presets.PRESETS starts from that preset; the other keys then
    override it, except those left None (a preset-based config, lineax_lm.train.config.lm_config,
    leaves every field it does not set None)."""
    d = dict(config.to_dict() if hasattr(config, "to_dict") else config)
    preset = d.pop("preset", None)
    placement = d.pop("attn_placement", None) or "periodic"
    if placement not in PLACEMENTS:
      raise ValueError(f"`attn_placement` must be one of {PLACEMENTS}; got {placement!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"unknown model config key(s) {unknown}; known: {sorted(names)}")
    if not preset:
      return cls(**cls._placed(d, placement))
    from lineax_lm.models.presets import get_preset  # presets import this module
    overrides = {k: v for k, v in d.items() if v is not None and not (k == "mixer_cfg" and not v)}
    base = get_preset(preset)
    if "mixer_cfg" in overrides:  # options added to the preset's, not replacing them
      overrides["mixer_cfg"] = {**dict(base.mixer_cfg), **dict(overrides["mixer_cfg"])}
    if "attn_ratio" in overrides and "attn_layers" not in overrides:
      overrides["attn_layers"] = None  # a preset's explicit layers give way to a ratio given here
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(cls)} | overrides
    return cls(**cls._placed(fields, placement))

  @classmethod
  def _placed(cls, fields: dict, placement: str) -> dict:
    """ModelConfig `fields` with the ratio's layers listed by `spread_attention_layers` when
    `placement` is "spread" (and no explicit attn_layers are given)."""
    if placement == "spread" and fields.get("attn_layers") is None:
      layers = fields.get("num_layers", cls.num_layers)
      ratio = fields.get("attn_ratio", cls.attn_ratio)
      return {**fields, "attn_layers": spread_attention_layers(layers, ratio)}
    return fields

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  @property
  def attention_indices(self) -> tuple:
    return attention_layers(self.num_layers, self.attn_ratio, self.attn_layers)

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


# How a ratio places its attention layers when a config section names `attn_placement`:
# "periodic" (`attention_layers`, the default) or "spread" (`spread_attention_layers`).
PLACEMENTS = ("periodic", "spread")


def attention_layers(num_layers: int, attn_ratio: str = "pure", explicit=None) -> tuple:
  """Indices of the attention layers. "r:1": r linear layers then one attention layer, repeated
  (when num_layers < r + 1 the one attention layer is the last layer)."""
  if explicit is not None:
    bad = [i for i in explicit if not 0 <= i < num_layers]
    if bad:
      raise ValueError(f"`attn_layers` {bad} are outside 0..{num_layers - 1}")
    return tuple(sorted(set(explicit)))
  r = _ratio_linear_layers(attn_ratio)
  if r == 0:
    return ()
  if r is None:
    return tuple(range(num_layers))
  period = r + 1
  layers = tuple(i for i in range(num_layers) if i % period == period - 1) or (num_layers - 1,)
  wanted = ratio_layer_count(num_layers, r)
  if len(layers) != wanted:
    warnings.warn(
        f"attn_ratio {attn_ratio!r} at {num_layers} layers places {len(layers)} attention layer(s) "
        f"{list(layers)} (effective {effective_ratio(num_layers, layers)}), where the ratio asks for "
        f"{wanted}; ratios whose counts coincide at this depth give the same model. "
        f"spread_attention_layers({num_layers}, {attn_ratio!r}) = "
        f"{list(spread_attention_layers(num_layers, attn_ratio))} (pass it as attn_layers)",
        stacklevel=2)
  return layers


def _ratio_linear_layers(attn_ratio: str) -> int | None:
  """r of an "r:1" ratio (linear layers per attention layer); 0 for "pure" (no attention), None
  for "transformer" (attention only). Raises for anything else."""
  ratio = str(attn_ratio).strip().lower()
  if ratio in ("pure", "none", "linear"):
    return 0
  if ratio in ("transformer", "attention", "all"):
    return None
  r, _, one = ratio.partition(":")
  if one != "1" or not r.isdigit() or int(r) < 1:
    raise ValueError(f"`attn_ratio` must be 'pure', 'transformer', 'attention' or 'r:1' with r >= 1 "
                     f"(e.g. '3:1'); got {attn_ratio!r}")
  return int(r)


def ratio_layer_count(num_layers: int, r: int) -> int:
  """The number of attention layers an "r:1" ratio asks for at `num_layers`: num_layers / (r + 1)
  rounded to the nearest integer (halves up), at least 1."""
  return min(num_layers, max(1, math.floor(num_layers / (r + 1) + 0.5)))


def spread_attention_layers(num_layers: int, attn_ratio: str) -> tuple:
  """Attention layers for `attn_ratio` that keep the asked share of attention at any depth:
  n = `ratio_layer_count` layers, each the last layer of one of n equal stretches of the stack
  (round((j + 1) num_layers / n) - 1). Where the periodic placement of `attention_layers` is exact
  (3:1 at 24 layers: 3, 7, ..., 23) the two agree; at 24 layers "24:1", "12:1", "6:1", "3:1" give
  1, 2, 3, 6 layers (effective 23:1, 11:1, 7:1, 3:1), where the periodic placement gives 1, 1, 3, 6.
  "pure" and "transformer" are as in `attention_layers`."""
  r = _ratio_linear_layers(attn_ratio)
  if not r:  # "pure" (0) or "transformer" (None)
    return attention_layers(num_layers, attn_ratio)
  n = ratio_layer_count(num_layers, r)
  return tuple(sorted({math.floor((j + 1) * num_layers / n + 0.5) - 1 for j in range(n)}))


def effective_ratio(num_layers: int, attn_layers) -> str:
  """The linear:attention ratio a placement has: "pure", "transformer", or "<linear / attention>:1"
  (e.g. "7:1" for 3 attention layers of 24; fractions with up to two decimals)."""
  n = len(set(attn_layers))
  if n == 0:
    return "pure"
  if n == num_layers:
    return "transformer"
  return f"{round((num_layers - n) / n, 2):g}:1"


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


class Block(nnx.Module):
  """Pre-norm block: x + mixer(attn_norm(x)), then + mlp(mlp_norm(x))."""

  def __init__(self, config: ModelConfig, layer_idx: int, rngs: nnx.Rngs):
    spec = config.layer_spec()
    self.is_attention = layer_idx in config.attention_indices
    name, mcfg = (("attention", config.attention_config()) if self.is_attention
                  else (config.mixer, config.linear_mixer_config()))
    self.attn_norm = RMSNorm(config.hidden, config.norm_eps, spec, rngs)
    self.mixer = build_mixer(name, mcfg, spec, rngs)
    self.mlp_norm = RMSNorm(config.hidden, config.norm_eps, spec, rngs)
    width = None if self.is_attention else config.linear_mlp_hidden
    width = width or config.mlp_hidden or mlp_width(config.hidden)
    self.mlp = SwiGLU(config.hidden, width, spec, rngs)

  def __call__(self, x, cache, ctx: Context, lower_bound=None):
    kw = {"lower_bound": lower_bound} if getattr(self.mixer, "uses_lower_bound", False) else {}
    h, cache = self.mixer(self.attn_norm(x), cache, ctx, **kw)
    x = x + h
    # The normalised input of the MLP's projections is recomputed in the backward from x, which is
    # kept anyway (the norm's own backward needs it): one [B, L, D] activation less per layer.
    return x + recomputed_between_dots(self._mlp)(x), cache

  def _mlp(self, x):
    return self.mlp(self.mlp_norm(x))


def call_shared(fn, module: nnx.Module, *args, remat: str | None = None):
  """fn(module, *args) as a pure function of the module's state, jitted with the module's graphdef
  as the cache key: identical layers (every linear block of a model, every teacher block) then share
  one trace and one lowering. A 30-layer model lowers each Pallas kernel once instead of 30 times
  (tracing and Triton lowering cost ~1 s a layer), and XLA inlines the calls, so the compiled
  program is unchanged. fn: a module-level function (its identity is part of the key) that reads
  the module's variables without updating them (updates would not be written back); remat: a
  REMAT_POLICIES name, None for none."""
  graphdef, state = nnx.split(module)
  return _pure_call(fn, graphdef, remat, state, *args)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _pure_call(fn, graphdef, remat, state, *args):
  def apply(state, *args):
    return fn(nnx.merge(graphdef, state), *args)
  if remat is not None:
    apply = jax.checkpoint(apply, policy=REMAT_POLICIES[remat])
  return apply(state, *args)


def _block_forward(block, x, cache, ctx, lower_bound):
  return block(x, cache, ctx, lower_bound)


def _linear_dtypes(module: nnx.Module) -> dict:
  """{path of an nnx.Linear's kernel or bias within `module`'s state: the Linear's compute dtype}:
  the parameters a Linear casts to its compute dtype before use, so that casting them earlier
  changes nothing."""
  dtypes = {}
  for path, sub in nnx.iter_graph(module):
    if isinstance(sub, nnx.Linear) and sub.dtype is not None:
      dtypes.update({(*path, "kernel"): sub.dtype, (*path, "bias"): sub.dtype})
  return dtypes


def scan_blocks(blocks: list, period: int, x, ctx, remat: str | None = None):
  """The training forward of `blocks` (no cache, no lower bounds) as one lax.scan over the repeats
  of a pattern of `period` blocks (1 for a pure model, 4 at "3:1"): XLA compiles the pattern once
  instead of once per layer. The per-layer parameters are stacked along a new leading axis inside
  the step (the parameter tree, and so checkpoints, are unchanged), the Linear weights already in
  their compute dtype (the cast they get anyway, before a copy of half the size); the gradients
  flow back through the stack into each layer's own leaves."""
  repeats = len(blocks) // period
  graphdefs, stacked = [], []
  for j in range(period):
    graphdefs.append(nnx.graphdef(blocks[j]))
    dtypes = _linear_dtypes(blocks[j])
    layers = [traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(blocks[j + r * period])))
              for r in range(repeats)]
    stacked.append({path: jnp.stack([layer[path].astype(dtypes.get(path, layer[path].dtype))
                                     for layer in layers]) for path in layers[0]})

  def body(x, params):
    for j in range(period):
      x, _ = _pure_call(_block_forward, graphdefs[j], remat,
                        traverse_util.unflatten_dict(params[j]), x, None, ctx, None)
    return x, None
  return lax.scan(body, x, stacked)[0]


class HybridLM(nnx.Module):
  """inputs [B, L] int32 -> logits [B, L, vocab] float32 (`hidden`: the states before the head)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, block=Block):
    self.config = config
    spec = config.layer_spec()
    normal = nnx.initializers.normal(config.init_std)
    self.embed = nnx.Embed(
        config.vocab_size, config.hidden, dtype=spec.dtype, param_dtype=spec.param_dtype, rngs=rngs,
        embedding_init=nnx.with_partitioning(normal, ("vocab", "embed"), eager_sharding=False))
    self.blocks = nnx.List([block(config, i, rngs) for i in range(config.num_layers)])
    self.norm = RMSNorm(config.hidden, config.norm_eps, spec, rngs)
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

  def step(self, inputs, cache):
    """Prefill (L > 1) or decode (L == 1) `inputs` [B, L] after the cache's `pos` tokens.
    Returns (logits [B, L, vocab] float32, new cache)."""
    x, cache = self._forward(inputs, None, None, cache)
    return self._logits(x), cache

  def init_cache(self, batch: int, max_len: int, dtype=None):
    """Zero cache for `batch` sequences of up to `max_len` tokens: {"pos": int32 scalar,
    "layers": [one cache per layer]} (linear layers: recurrent + conv states; attention: KV)."""
    return {"pos": jnp.zeros((), jnp.int32),
            "layers": [b.mixer.init_cache(batch, max_len, dtype) for b in self.blocks]}

  def cache_bytes(self, context_len: int, dtype=None) -> dict:
    """Bytes one sequence's cache needs at `context_len` tokens, per layer kind, computed from the
    layer dimensions (not from a cache)."""
    out = {"attention": 0, "linear": 0}
    for b in self.blocks:
      out["attention" if b.is_attention else "linear"] += b.mixer.cache_bytes(context_len, dtype)
    out["total"] = out["attention"] + out["linear"]
    return out

  def generate(self, prompt_ids, max_new_tokens: int, **sampling):
    """See lineax_lm.models.generate.generate."""
    return generation.generate(self, prompt_ids, max_new_tokens, **sampling)

  def _lower_bounds(self):
    if self.lower_bounds is None:
      return [None] * len(self.blocks)
    lb = jax.nn.softmax(self.lower_bounds[...].astype(jnp.float32), axis=0)
    lb = jnp.cumsum(lb, axis=0) - lb[0]
    return [None] + [lb[i] for i in range(1, len(self.blocks))]  # layer 0's bound is 0: none

  def _scan_period(self):
    """The number of blocks per repeat of the layer pattern when the forward can scan over the
    repeats (config.scan_layers, at least two repeats, no per-layer lower bounds), else None."""
    kinds = [b.is_attention for b in self.blocks]
    if not self.config.scan_layers or self.lower_bounds is not None:
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

  def _forward(self, inputs, segment_ids, positions, cache):
    """-> (final normalised hidden states [B, L, D], new cache or None)."""
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
    start = None if cache is None else cache["pos"]
    if positions is None:
      positions = jnp.arange(L, dtype=jnp.int32) + (0 if start is None else start)
    ctx = Context(jnp.broadcast_to(positions, (B, L)).astype(jnp.int32), packing, start)

    remat = config.remat if config.remat != "none" and cache is None else None
    x = self.embed(inputs)
    layer_caches = []
    period = self._scan_period() if cache is None else None
    if period is not None:
      x = scan_blocks(list(self.blocks), period, x, ctx, remat)
    else:
      for i, (block, lb) in enumerate(zip(self.blocks, self._lower_bounds())):
        x, layer_cache = call_shared(_block_forward, block, x,
                                     None if cache is None else cache["layers"][i], ctx, lb,
                                     remat=remat)
        layer_caches.append(layer_cache)
    x = self.norm(x)
    if overflow is not None:  # NaN reaches the logits (and any loss on them) through the head
      x = jnp.where(overflow, jnp.nan, x)
    new_cache = None if cache is None else {"pos": cache["pos"] + L, "layers": layer_caches}
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

  def top(key):
    params = nnx.to_pure_dict(nnx.state(HybridLM(config, nnx.Rngs(key), block=_abstract_block), nnx.Param))
    del params["blocks"]
    return params
  params = jax.jit(top, out_shardings=out_sh and {k: v for k, v in out_sh.items() if k != "blocks"})(
      jax.random.fold_in(key, config.num_layers))
  programs, blocks = {}, {}
  for i in range(config.num_layers):
    kind = i in config.attention_indices
    if kind not in programs:  # a block's parameters do not depend on its index, only on its kind
      programs[kind] = jax.jit(
          lambda k, i=i: nnx.to_pure_dict(nnx.state(Block(config, i, nnx.Rngs(k)), nnx.Param)),
          out_shardings=out_sh and out_sh["blocks"][i])
    blocks[i] = programs[kind](jax.random.fold_in(key, i))
  nnx.replace_by_pure_dict(state, params | {"blocks": blocks})
  return state


def init_model(config: ModelConfig, seed) -> HybridLM:
  """A randomly initialised HybridLM built from `init_params` (block-wise compiled init)."""
  return nnx.merge(nnx.graphdef(abstract_model(config)), init_params(config, seed))
