"""flash-linear-attention (fla) checkpoints in and out of lineax_lm.

    model = lineax_lm.from_pretrained("340M-20B-GatedDeltaNet-hybrid-3-1")  # an fla folder
    lm = lineax_lm.convert.load_fla(path)           # the model with the folder's tokenizer.json
    lineax_lm.save_pretrained(model, "out", format="fla")    # fla's AutoModelForCausalLM loads it

An fla folder is a config.json whose `model_type` is one of FLA_MODEL_TYPES, its weights in
model.safetensors, sharded *.safetensors with model.safetensors.index.json, or pytorch_model*.bin
(with pytorch_model.bin.index.json when sharded; read with torch, which only .bin needs), and the
tokenizer files beside them. Hybrids are fla's `attn` config: the listed layers are softmax attention
(num_heads, num_kv_heads, window_size, rope_theta), the others the model type's mixer.

The mapping is exact, both ways. fla's blocks are lineax_lm's (pre-norm RMSNorm, the mixer, RMSNorm,
SwiGLU MLP), so each fla tensor is one lineax_lm parameter: `model.layers.{i}.attn.*` is
`blocks.{i}.mixer.*`, torch Linear weights [out, in] are NNX kernels [in, out], short-convolution
weights [C, 1, W] are [W, C], and each mixer's output norm takes the name its fla layer gives it
(FlaType.output_norm). Reading stops, naming the file and the tensor or option, on a tensor that
is missing, unexpected, of the wrong shape or not floating point, on an unreadable file, and on
any config option whose value lineax_lm does not compute as fla does (an fla option it does not
know at all included): a checkpoint loads as fla runs it or not at all. Writing stops on any
lineax_lm option that fla's model of that type cannot express.

fla's rwkv6 model is HybridLM with block="rwkv6" (LayerNorms with biases, RWKV-6 channel mixing):
`model.layers.0.pre_norm` is `embed_norm`, `ffn_norm` and `ffn` are `mlp_norm` and `mlp`
(`ffn.{key,receptance}.{mu,linear.weight}`, `ffn.value.weight`). Its time mixing is the RWKV6
mixer tensor for tensor: `attn.x_proj.0.{mu, linear.weight}` are `x_mu` and `x_down`,
`attn.x_proj.2.weight` [D, 5 R] is `x_up` [5, R, D] viewed [5 R, D] and transposed,
`attn.{r,k,v,g}_proj.linear.weight` and `attn.w_proj.linear.lora.{0,2}.*` are `{r,k,v,g}_proj`
and `w_proj.layers.{0,2}`, and `x_bias`, `bonus`, `g_norm` and `o_proj` keep their names.
"""
from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from lineax_lm import storage
from lineax_lm.layers import mlp_width
from lineax_lm.layers.channel_mix import channel_mix_width

CONFIG_FILE = "config.json"
SAFETENSORS_FILE, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_FILE, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
# Copied beside the weights by the command line (whichever the folder has).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "generation_config.json")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


@dataclasses.dataclass(frozen=True)
class Check:
  """An fla option lineax_lm computes only at some values: `ok(value, fields)` says whether
  `value` is one of them (fields: the config's values read so far); `what` says which."""
  default: Any
  ok: Callable[[Any, dict], bool]
  what: str


def _equal(*values) -> Check:
  return Check(values[0], lambda v, _: v in values, " or ".join(map(repr, values)))


def _heads_or_none(field: str = "num_heads") -> Check:
  return Check(None, lambda v, f: v is None or v == f[field], f"None or `{field}`")


@dataclasses.dataclass(frozen=True)
class FlaType:
  """How one fla model type maps onto a lineax_lm mixer.

  options: (fla config field, lineax_lm mixer option, fla 0.6.0's default), read and written as is.
  fixed: mixer options fla's model builds its layer with whatever its config says.
  checks: fla fields lineax_lm computes only at some values (Check).
  ignored: fla fields fla's model of this type does not read (no effect on its output).
  aliases: {fla field: {fla value: the lineax_lm option's value}} where the two name a value
    differently.
  output_norm: the name of the mixer's output norm in fla's layer, given its config fields.
  defaults: fla 0.6.0's defaults of the shared fields where this type's differ from DEFAULTS.
  block: the ModelConfig block kind of fla's blocks of this type.
  """
  mixer: str | None
  architecture: str
  options: tuple = ()
  fixed: dict = dataclasses.field(default_factory=dict)
  checks: dict = dataclasses.field(default_factory=dict)
  ignored: tuple = ()
  aliases: dict = dataclasses.field(default_factory=dict)
  output_norm: Callable[[dict], str] = lambda fields: "o_norm"
  defaults: dict = dataclasses.field(default_factory=dict)
  block: str = "swiglu"


def _gated_norm_name(fields: dict) -> str:
  # GLA and RetNet fuse the swish-gated norm into one module when the gate is on and fuse_norm is
  # set; both compute rmsnorm(o) * weight * swish(g)
  fused = fields["use_output_gate"] and fields["fuse_norm"]
  return "g_norm_swish_gate" if fused else "g_norm"


_AFFINE = {"elementwise_affine": _equal(True)}
FLA_TYPES = {
    "gla": FlaType(
        "gla", "GLAForCausalLM",
        options=(("num_heads", "num_heads", 4), ("expand_k", "expand_k", 0.5),
                 ("expand_v", "expand_v", 1.0), ("use_short_conv", "use_short_conv", False),
                 ("conv_size", "conv_size", 4), ("use_output_gate", "use_output_gate", True),
                 ("clamp_min", "clamp_min", None)),
        fixed=dict(gate_logit_normalizer=16.0, gate_low_rank_dim=16, conv_bias=False),
        checks=dict(num_kv_heads=_heads_or_none(), feature_map=_equal(None), **_AFFINE),
        ignored=("use_gk", "use_gv"), output_norm=_gated_norm_name),
    "gated_deltanet": FlaType(
        "gated_deltanet", "GatedDeltaNetForCausalLM",
        options=(("num_heads", "num_heads", 6), ("head_dim", "head_dim", 256),
                 ("expand_v", "expand_v", 2.0), ("use_gate", "use_gate", True),
                 ("use_short_conv", "use_short_conv", True),
                 ("allow_neg_eigval", "allow_neg_eigval", False), ("conv_size", "conv_size", 4),
                 ("output_gate_activation", "output_gate_activation", "swish")),
        fixed=dict(conv_bias=False),
        checks=dict(num_v_heads=_heads_or_none(),
                    output_gate_activation=_equal("swish", "silu", "sigmoid")),
        aliases=dict(output_gate_activation={"silu": "swish"}),
        defaults=dict(num_hidden_layers=21)),
    "delta_net": FlaType(
        "deltanet", "DeltaNetForCausalLM",
        options=(("num_heads", "num_heads", 16), ("expand_k", "expand_k", 1.0),
                 ("expand_v", "expand_v", 1.0), ("use_gate", "use_gate", False),
                 ("use_beta", "use_beta", True), ("use_short_conv", "use_short_conv", True),
                 ("allow_neg_eigval", "allow_neg_eigval", False), ("conv_size", "conv_size", 4),
                 ("qk_norm", "qk_norm", "l2"), ("qk_activation", "qk_activation", "silu")),
        fixed=dict(conv_bias=False),
        ignored=("use_output_norm",)),  # passed to fla's DeltaNet layer, which does not read it
    "hgrn": FlaType(
        "hgrn", "HGRNForCausalLM",
        options=(("expand_ratio", "expand_ratio", 1), ("use_short_conv", "use_short_conv", False),
                 ("conv_size", "conv_size", 4)),
        fixed=dict(conv_bias=False),
        checks=dict(use_lower_bound=_equal(True), **_AFFINE),
        output_norm=lambda fields: "g_norm"),
    "hgrn2": FlaType(
        "hgrn2", "HGRN2ForCausalLM",
        options=(("expand_ratio", "expand_ratio", 128), ("use_short_conv", "use_short_conv", False),
                 ("conv_size", "conv_size", 4)),
        # fla's HGRN-2 layer applies its output norm through rms_norm_linear without the norm's eps:
        # that function's default, 1e-5, whatever norm_eps says (the blocks' norms use norm_eps)
        fixed=dict(conv_bias=False, norm_eps=1e-5),
        checks=dict(use_lower_bound=_equal(True), **_AFFINE),
        ignored=("num_heads",),  # read only when expand_ratio is None (_hgrn2_expand_ratio)
        output_norm=lambda fields: "g_norm"),
    "retnet": FlaType(
        "retention", "RetNetForCausalLM",
        options=(("num_heads", "num_heads", 8), ("expand_k", "expand_k", 1.0),
                 ("expand_v", "expand_v", 2.0), ("use_output_gate", "use_output_gate", True)),
        # fla's RetNet model builds its layer without short convolutions and with RoPE base 10,000
        fixed=dict(use_short_conv=False, conv_bias=False, rope_theta=10000.0),
        checks=dict(num_kv_heads=_heads_or_none(), feature_map=_equal(None), **_AFFINE),
        ignored=("use_short_conv", "conv_size"), output_norm=_gated_norm_name,
        defaults=dict(hidden_ratio=2)),
    "kda": FlaType(
        "kda", "KDAForCausalLM",
        options=(("num_heads", "num_heads", 16), ("head_dim", "head_dim", 128),
                 ("expand_v", "expand_v", 1.0), ("use_short_conv", "use_short_conv", True),
                 ("allow_neg_eigval", "allow_neg_eigval", False), ("conv_size", "conv_size", 4)),
        fixed=dict(conv_bias=False),
        checks=dict(num_v_heads=_heads_or_none(), safe_gate=_equal(False),
                    lower_bound=_equal(None))),
    "linear_attn": FlaType(
        "linear_attn", "LinearAttentionForCausalLM",
        options=(("num_heads", "num_heads", 4), ("expand_k", "expand_k", 1.0),
                 ("expand_v", "expand_v", 1.0), ("feature_map", "feature_map", "elementwise_product")),
        fixed=dict(use_short_conv=False, normalize=False),
        # norm_feature_map: fla's decode carries the normalizer's running key sum in its cache,
        # lineax_lm's restarts it, so generation would differ from fla's
        checks=dict(num_kv_heads=_heads_or_none(), tie_feature_map_qk=_equal(False),
                    norm_q=_equal(False), norm_k=_equal(False), norm_feature_map=_equal(False),
                    **_AFFINE),
        output_norm=lambda fields: "norm"),
    "rwkv6": FlaType(
        "rwkv6", "RWKV6ForCausalLM",
        options=(("num_heads", "num_heads", 4), ("expand_k", "expand_k", 0.5),
                 ("expand_v", "expand_v", 1.0), ("proj_low_rank_dim", "proj_low_rank_dim", 32),
                 ("gate_low_rank_dim", "gate_low_rank_dim", 64)),
        fixed=dict(use_short_conv=False),
        # norm_first=False (no LayerNorm before layer 0) and LayerNorms without biases are blocks
        # HybridLM does not build
        checks=dict(hidden_act=_equal("sqrelu"), norm_first=_equal(True), norm_bias=_equal(True)),
        ignored=("fuse_norm",),  # fla's fused LayerNorm or torch's: the same function
        output_norm=lambda fields: "g_norm", defaults=dict(norm_eps=1e-5, hidden_ratio=3.5),
        block="rwkv6"),
    "transformer": FlaType(
        None, "TransformerForCausalLM",
        checks=dict(qkv_bias=_equal(False), qk_norm=_equal(False)),
        ignored=("elementwise_affine",),  # TransformerConfig keeps it; its blocks do not read it
        defaults=dict(num_heads=32)),
}
FLA_MODEL_TYPES = tuple(FLA_TYPES)
# fla 0.6.0's defaults of the fields every model type has (FlaType.defaults overrides).
DEFAULTS = dict(hidden_size=2048, num_hidden_layers=24, vocab_size=32000, norm_eps=1e-6,
                hidden_ratio=4, intermediate_size=None, tie_word_embeddings=False,
                initializer_range=0.02, fuse_norm=True, attn=None)
SHARED_CHECKS = dict(hidden_act=_equal("swish"), attnres_block_size=_equal(None))
# Fields that change no output: kernels chosen, fused training ops, generation and Hugging Face
# bookkeeping.
NO_EFFECT = frozenset("""
    attn_mode fuse_swiglu fuse_cross_entropy fuse_linear_cross_entropy use_l2warp
    max_position_embeddings use_cache bos_token_id eos_token_id pad_token_id model_type
    architectures transformers_version torch_dtype dtype _name_or_path auto_map
    output_attentions output_hidden_states return_dict use_return_dict torchscript
    is_encoder_decoder tokenizer_class chunk_size_feed_forward id2label label2id problem_type
    keys_to_ignore_at_inference _attn_implementation_autoset _commit_hash use_bfloat16
    pruned_heads tie_encoder_decoder""".split())
ATTENTION_KEYS = ("layers", "num_heads", "num_kv_heads", "qkv_bias", "window_size", "rope_theta")


class _Fields:
  """An fla config.json read field by field with fla 0.6.0's defaults; `unread()` lists the
  fields no rule read."""

  def __init__(self, meta: dict, fla_type: FlaType, file):
    self.meta, self.type, self.file, self.read = meta, fla_type, file, {}

  def get(self, name: str, default=None):
    value = self.meta.get(name, default)
    self.read[name] = value
    return value

  def shared(self, name: str):
    return self.get(name, self.type.defaults.get(name, DEFAULTS.get(name)))

  def check(self, name: str, check: Check):
    value = self.get(name, check.default)
    if not check.ok(value, self.read):
      raise ValueError(f"{self.file}: fla option {name}={value!r} is not supported by lineax_lm "
                       f"(it computes {name} = {check.what} only)")
    return value

  def unread(self) -> list:
    return sorted(set(self.meta) - set(self.read) - NO_EFFECT)


# ----------------------------------------------------------------------------------- configs
def config_from_fla(meta: dict, file="config.json", **overrides):
  """fla config.json values -> (lineax_lm ModelConfig, name of the mixers' output norm in fla).
  overrides: ModelConfig fields set besides (backend, dtype, param_dtype, ...)."""
  from lineax_lm.models.config import ModelConfig
  model_type = meta.get("model_type")
  if model_type not in FLA_TYPES:
    raise ValueError(f"{file}: model_type {model_type!r} is not an fla model type lineax_lm reads "
                     f"({', '.join(FLA_MODEL_TYPES)})")
  fla_type = FLA_TYPES[model_type]
  f = _Fields(meta, fla_type, file)
  hidden, layers = f.shared("hidden_size"), f.shared("num_hidden_layers")
  ratio = f.shared("hidden_ratio")  # None: fla's RWKV6FeedForward takes 3.5, its GatedMLP 4
  mlp = f.shared("intermediate_size") or (channel_mix_width(hidden, ratio or 3.5)
                                          if fla_type.block == "rwkv6" else mlp_width(hidden, ratio or 4))
  fields = dict(vocab_size=f.shared("vocab_size"), num_layers=layers, hidden=hidden,
                mlp_hidden=mlp, block=fla_type.block, norm_eps=f.shared("norm_eps"),
                tie_embeddings=bool(f.shared("tie_word_embeddings")),
                init_std=f.shared("initializer_range"))
  if fla_type.mixer is None:  # fla's transformer: every layer attention, configured at the top
    attention = dict(num_heads=f.shared("num_heads"), num_kv_heads=f.get("num_kv_heads"),
                     window_size=f.get("window_size"), rope_theta=f.get("rope_theta", 10000.0))
    fields.update(attn_ratio="transformer", **_attention_fields(attention))
  else:
    mixer_cfg = {}
    for field, option, default in fla_type.options:
      value = f.get(field, default)
      mixer_cfg[option] = fla_type.aliases.get(field, {}).get(value, value)
    if model_type == "hgrn2":
      mixer_cfg["expand_ratio"] = _hgrn2_expand_ratio(f, hidden)
    fields.update(mixer=fla_type.mixer, mixer_cfg={**mixer_cfg, **fla_type.fixed})
    attn = f.shared("attn")
    if attn is not None:
      spec = _attention_spec(attn, file)
      fields.update(attn_layers=tuple(spec["layers"]), **_attention_fields(spec))
  for name, check in {**SHARED_CHECKS, **fla_type.checks}.items():  # after the values they read
    f.check(name, check)
  norm_name = fla_type.output_norm(f.read | {"fuse_norm": f.shared("fuse_norm")})
  for name in fla_type.ignored:
    f.get(name)
  unread = f.unread()
  if unread:
    raise ValueError(f"{file}: fla option(s) {unread} are unknown to lineax_lm's reader of "
                     f"model_type {model_type!r}; an option it does not know could change what the "
                     "model computes, so the import stops")
  return ModelConfig(**{**fields, **overrides}), norm_name


def _hgrn2_expand_ratio(f: _Fields, hidden: int) -> int:
  """fla's HGRN-2: expand_ratio when set, else hidden_size // num_heads."""
  ratio = f.get("expand_ratio", 128)
  if ratio is None:
    heads = f.get("num_heads")
    if not heads:
      raise ValueError(f"{f.file}: HGRN-2 needs `expand_ratio` or `num_heads`; both are None")
    ratio = hidden // heads
  return ratio


def _attention_spec(attn, file) -> dict:
  """fla's `attn` (one spec or a list of specs of the same attention) -> one spec."""
  specs = [attn] if isinstance(attn, dict) else attn
  if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) for s in specs):
    raise ValueError(f"{file}: `attn` must be a dict or a list of dicts (fla's AttentionSpec); "
                     f"got {attn!r}")
  merged = None
  for spec in specs:
    unknown = sorted(set(spec) - set(ATTENTION_KEYS))
    if unknown:
      raise ValueError(f"{file}: attn option(s) {unknown} are unknown to lineax_lm; it reads "
                       f"{list(ATTENTION_KEYS)}")
    if "layers" not in spec or "num_heads" not in spec:
      raise ValueError(f"{file}: an `attn` spec needs `layers` and `num_heads`; got {spec}")
    if spec.get("qkv_bias", False):
      raise ValueError(f"{file}: attn option qkv_bias=True is not supported by lineax_lm (its "
                       "hybrid attention layers have no q/k/v biases)")
    settings = {k: spec.get(k) for k in ("num_heads", "num_kv_heads", "window_size")}
    settings["num_kv_heads"] = settings["num_kv_heads"] or settings["num_heads"]
    settings["rope_theta"] = float(spec.get("rope_theta", 10000.0))
    if merged is None:
      merged = {**settings, "layers": list(spec["layers"])}
    elif {k: merged[k] for k in settings} != settings:
      raise ValueError(f"{file}: `attn` specs with different settings ({merged} and {spec}) are "
                       "not supported: lineax_lm's hybrid has one attention configuration")
    else:
      merged["layers"] += list(spec["layers"])
  return merged


def _attention_fields(spec: dict) -> dict:
  """An fla attention spec -> ModelConfig fields (fla's head dim is hidden_size // num_heads)."""
  return dict(heads=spec["num_heads"], kv_heads=spec["num_kv_heads"] or spec["num_heads"],
              window=spec["window_size"], rope_theta=float(spec["rope_theta"]))


def config_to_fla(config, tokenizer=None) -> tuple[dict, str]:
  """A lineax_lm ModelConfig -> (fla config.json values, the output norm's name in fla). Raises
  when fla's model of that type computes anything differently."""
  attention = config.attention_indices
  model_type = "transformer" if len(attention) == config.num_layers else next(
      (t for t, spec in FLA_TYPES.items() if spec.mixer == config.mixer), None)
  if model_type is None:
    raise ValueError(f"mixer {config.mixer!r} has no fla model type lineax_lm writes "
                     f"(mixers: {sorted(s.mixer for s in FLA_TYPES.values() if s.mixer)})")
  fla_type = FLA_TYPES[model_type]
  meta = dict(model_type=model_type, architectures=[fla_type.architecture],
              hidden_size=config.hidden, num_hidden_layers=config.num_layers,
              vocab_size=config.vocab_size, intermediate_size=config.mlp_width(True),
              hidden_ratio=fla_type.defaults.get("hidden_ratio", 4),
              hidden_act={**SHARED_CHECKS, **fla_type.checks}["hidden_act"].default,
              norm_eps=config.norm_eps, tie_word_embeddings=config.tie_embeddings,
              initializer_range=config.init_std, fuse_norm=True, fuse_cross_entropy=True,
              max_position_embeddings=2048, use_cache=True)
  if fla_type.block == "swiglu":
    meta["fuse_swiglu"] = True
  attn = dict(num_heads=config.heads, num_kv_heads=config.kv_heads or config.heads,
              window_size=config.window, rope_theta=config.rope_theta)
  if fla_type.mixer is None:
    meta.update(attn, qkv_bias=False, qk_norm=False)
  else:
    mixer = config.linear_mixer_config()
    meta.update({field: getattr(mixer, option) for field, option, _ in fla_type.options})
    for name, check in fla_type.checks.items():
      meta.setdefault(name, check.default)
    meta["attn"] = dict(layers=list(attention), qkv_bias=False, **attn) if attention else None
  if tokenizer is not None:
    meta.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
                pad_token_id=tokenizer.pad_id)
  back, norm_name = config_from_fla(meta, "the fla config written for it", backend=config.backend)
  ours, theirs = _structure(config), _structure(back)
  differences = [f"{k} is {ours[k]!r} here, {theirs.get(k)!r} in fla" for k in ours
                 if ours[k] != theirs.get(k)]
  if differences:
    raise ValueError(f"fla's {model_type!r} model cannot express this lineax_lm model: "
                     + "; ".join(differences))
  return meta, norm_name


def _structure(config) -> dict:
  """What decides a model's output, as comparable values: the dimensions, the layer placement,
  each layer kind's options (backend and attention implementation aside) and the MLP widths."""
  def options(cfg):
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("backend", "attn_impl")}
  attention = config.attention_indices
  mlp = config.mlp_width(True)
  out = dict(vocab_size=config.vocab_size, num_layers=config.num_layers, hidden=config.hidden,
             norm_eps=config.norm_eps, tie_embeddings=config.tie_embeddings, block=config.block,
             attention_layers=attention, mlp_hidden=mlp)
  if attention:
    attn = options(config.attention_config())
    attn["num_kv_heads"] = attn["num_kv_heads"] or attn["num_heads"]
    attn["head_dim"] = attn["head_dim"] or config.hidden // attn["num_heads"]
    out.update({f"attention option {k}": v for k, v in attn.items()})
  if len(attention) < config.num_layers:
    out["mixer"] = config.mixer
    out.update({f"mixer option {k}": v
                for k, v in options(config.linear_mixer_config()).items()})
    out["linear_mlp_hidden"] = config.mlp_width(False)
  return out


# ----------------------------------------------------------------------------------- tensors
# RWKV-6 time mixing: the start of a lineax_lm parameter path -> (fla's name for it, its layout
# when that start fixes it); the rest of the path follows
RWKV6_MIXER_NAMES = {
    ("x_mu",): ("x_proj.0.mu", "same"),
    ("x_down", "kernel"): ("x_proj.0.linear.weight", "linear"),
    ("x_up",): ("x_proj.2.weight", "stacked_linear"),
    ("w_proj", "layers", 0): ("w_proj.linear.lora.0", None),
    ("w_proj", "layers", 2): ("w_proj.linear.lora.2", None),
    **{(f"{p}_proj",): (f"{p}_proj.linear", None) for p in "rkvg"},
}
RWKV6_MIXES = 5  # r, w, k, v, g: the leading axis of x_up


def fla_tensor_name(path: tuple, norm_name: str, config) -> tuple[str, str]:
  """A lineax_lm parameter path of a model of `config` -> (fla tensor name, layout): "linear"
  ([in, out] kernel <-> torch's [out, in]), "conv" ([W, C] <-> torch's depthwise Conv1d
  [C, 1, W]), "stacked_linear" (RWKV-6's x_up [5, R, D] <-> torch's [D, 5 R]) or "same"."""
  top = {("embed", "embedding"): ("model.embeddings.weight", "same"),
         ("lm_head",): ("lm_head.weight", "linear"),
         ("lower_bounds",): ("model.lower_bounds", "same")}
  if path in top:
    return top[path]
  if path[0] in ("norm", "embed_norm"):  # fla's LayerNorm before layer 0 belongs to layer 0
    return f"model.{'norm' if path[0] == 'norm' else 'layers.0.pre_norm'}.{path[1]}", "same"
  _, layer, part, *rest = path
  rwkv6 = config.block == "rwkv6"
  parts = {"mixer": "attn", "mlp_norm": "ffn_norm", "mlp": "ffn"} if rwkv6 else {"mixer": "attn"}
  names = [f"model.layers.{layer}", parts.get(part, part)]
  layout = "same"
  if rwkv6 and part == "mixer" and layer not in config.attention_indices:
    for prefix, (name, prefix_layout) in RWKV6_MIXER_NAMES.items():
      if tuple(rest[:len(prefix)]) == prefix:
        names.append(name)
        rest, layout = rest[len(prefix):], prefix_layout or layout
        break
  for i, p in enumerate(rest):
    if p == "layers" and i + 1 < len(rest) and isinstance(rest[i + 1], int):
      continue  # nnx.Sequential's list: torch's Sequential numbers its children directly
    if p == "kernel":
      p, layout = "weight", "linear"
    elif p == "weight" and str(names[-1]).endswith("_conv1d"):
      layout = "conv"
    elif p == "o_norm" and part == "mixer" and i == 0:
      p = norm_name
    names.append(str(p))
  return ".".join(names), layout


def to_fla_layout(value: np.ndarray, layout: str) -> np.ndarray:
  if layout == "linear":
    return np.ascontiguousarray(value.T)
  if layout == "conv":
    return np.ascontiguousarray(value.T[:, None, :])
  if layout == "stacked_linear":
    return np.ascontiguousarray(value.reshape(-1, value.shape[-1]).T)
  return value


def fla_shape(shape: tuple, layout: str) -> tuple:
  """The shape fla gives a parameter of `shape` in `layout`."""
  if layout == "linear":
    return tuple(reversed(shape))
  if layout == "conv":
    return (shape[1], 1, shape[0])
  if layout == "stacked_linear":
    return (shape[2], shape[0] * shape[1])
  return tuple(shape)


def from_fla_layout(value: np.ndarray, layout: str) -> np.ndarray:
  if layout == "linear":
    return value.T
  if layout == "conv":
    if value.ndim != 3 or value.shape[1] != 1:
      return value  # the shape check names it
    return value[:, 0, :].T
  if layout == "stacked_linear":
    if value.ndim != 2 or value.shape[1] % RWKV6_MIXES:
      return value  # the shape check names it
    return value.T.reshape(RWKV6_MIXES, value.shape[1] // RWKV6_MIXES, value.shape[0])
  return value


class _Weights:
  """The tensors of an fla folder: `files` {name: file} of the single file or of every shard the
  index lists (a tensor a shard holds beyond the index included, so that it is mapped or refused
  like any other), each file read once."""

  def __init__(self, root):
    self.root, self._loaded = root, {}
    for single, index in ((SAFETENSORS_FILE, SAFETENSORS_INDEX), (BIN_FILE, BIN_INDEX)):
      if (root / single).exists():
        self.files = {name: single for name in self._read(single)}
        return
      if (root / index).exists():
        self.files = self._index(index)
        return
    raise FileNotFoundError(f"{root}: no fla weights: none of {SAFETENSORS_FILE}, "
                            f"{SAFETENSORS_INDEX}, {BIN_FILE}, {BIN_INDEX}")

  def _index(self, index: str) -> dict:
    try:
      weight_map = json.loads((self.root / index).read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(f"{self.root / index}: not a weight index with a `weight_map` ({e!r})") from e
    files = dict(weight_map)
    for file in sorted(set(weight_map.values())):
      if not (self.root / file).exists():
        raise FileNotFoundError(f"{self.root / index} lists {file}, which is not in {self.root}")
      listed = {n for n, f in weight_map.items() if f == file}
      missing = sorted(listed - set(self._read(file)))
      if missing:
        raise ValueError(f"{self.root / file} lacks tensor {missing[0]!r}, which {index} places "
                         "in it" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
      for name in self._read(file):
        files.setdefault(name, file)
    return files

  def _read(self, file: str) -> dict:
    if file not in self._loaded:
      path = self.root / file
      data = path.read_bytes()
      self._loaded[file] = _read_bin(data, path) if file.endswith(".bin") else _read_safetensors(
          data, path)
    return self._loaded[file]

  def names(self) -> set:
    return set(self.files)

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` as float32 numpy; raises naming it and its file unless floating point."""
    file = self.files[name]
    value = self._read(file)[name]
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype not in FLOAT_DTYPES:
      raise ValueError(f"{self.root / file}: tensor {name!r} has dtype {dtype}; fla weights are "
                       f"floating point ({', '.join(FLOAT_DTYPES)})")
    if hasattr(value, "detach"):  # a torch tensor (.bin)
      return value.detach().float().numpy()
    return value.astype(np.float32)


def _read_safetensors(data: bytes, path) -> dict:
  """{name: numpy array} of a safetensors file's bytes (bfloat16 through ml_dtypes), raising
  naming `path` (and the tensor) on a truncated or malformed file."""
  import ml_dtypes
  dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
            "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
            "BOOL": np.bool_}
  size = int.from_bytes(data[:8], "little") if len(data) >= 8 else None
  if size is None or 8 + size > len(data):
    raise ValueError(f"{path}: not a readable safetensors file (truncated: its header runs past "
                     f"the end of the file's {len(data)} bytes)")
  try:
    header = json.loads(data[8:8 + size])
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not a readable safetensors file (its header is not JSON: {e})") from e
  header.pop("__metadata__", None)
  body = memoryview(data)[8 + size:]
  tensors = {}
  for name, info in header.items():
    try:
      start, end = info["data_offsets"]
      count = int(np.prod(info["shape"], dtype=np.int64))
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"{path}: not a readable safetensors file (tensor {name!r} has a malformed "
                       f"header entry {info!r})") from e
    if end > len(body):
      raise ValueError(f"{path}: not a readable safetensors file (truncated: tensor {name!r} ends "
                       f"at byte {end} of the data, which has {len(body)})")
    if info["dtype"] not in dtypes:
      raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}; fla weights are "
                       f"floating point ({', '.join(FLOAT_DTYPES)})")
    dtype = np.dtype(dtypes[info["dtype"]])
    if end - start != count * dtype.itemsize:
      raise ValueError(f"{path}: not a readable safetensors file (tensor {name!r} has "
                       f"{end - start} bytes for shape {info['shape']} of {info['dtype']})")
    tensors[name] = np.frombuffer(body[start:end], dtype).reshape(info["shape"])
  return tensors


def _read_bin(data: bytes, path) -> dict:
  try:
    import torch
  except ImportError as e:
    raise ImportError(f"{path}: reading pytorch_model*.bin checkpoints needs torch (pip install "
                      "torch); safetensors checkpoints do not") from e
  try:
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
  except Exception as e:
    raise ValueError(f"{path}: not a readable torch checkpoint ({e})") from e
  if not isinstance(state, dict):
    raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
  return state


# ---------------------------------------------------------------------------------- folders
def fla_model_type(path) -> str | None:
  """The model_type of folder `path`'s config.json when it is an fla model type, else None."""
  file = storage.as_path(path) / CONFIG_FILE
  if not file.exists():
    return None
  try:
    model_type = json.loads(file.read_text()).get("model_type")
  except (json.JSONDecodeError, AttributeError):
    return None
  return model_type if model_type in FLA_TYPES else None


def load_fla(path, **overrides):
  """lineax_lm.Pretrained from the fla checkpoint folder `path`: the HybridLM with fla's weights
  and, when the folder has a tokenizer.json, its tokenizer. overrides: ModelConfig fields (backend,
  dtype, param_dtype, ...)."""
  from lineax_lm.data.tokenizer import HFTokenizer
  from lineax_lm.models.hybrid import abstract_model
  from lineax_lm.models.pretrained import Pretrained, _flat_params
  root = storage.as_path(path)
  config_file = root / CONFIG_FILE
  if not config_file.exists():
    raise FileNotFoundError(f"{path} is not an fla checkpoint: it has no {CONFIG_FILE}")
  try:
    meta = json.loads(config_file.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_file}: not JSON ({e})") from e
  if not isinstance(meta, dict):
    raise ValueError(f"{config_file}: not a JSON object")
  config, norm_name = config_from_fla(meta, config_file, **overrides)
  weights = _Weights(root)
  abstract = abstract_model(config)
  want = _flat_params(abstract)
  params, used = {}, set()
  for key, spec in want.items():
    name, layout = fla_tensor_name(key, norm_name, config)
    if name not in weights.files:
      raise ValueError(f"{root}: the checkpoint has no tensor {name!r}, which config.json's "
                       f"{meta['model_type']!r} model needs")
    value = from_fla_layout(weights.get(name), layout)
    if tuple(value.shape) != tuple(spec.shape):
      raise ValueError(f"{root / weights.files[name]}: tensor {name!r} has shape "
                       f"{tuple(weights.get(name).shape)}; config.json's model needs "
                       f"{fla_shape(spec.shape, layout)}")
    params[key] = jnp.asarray(value, spec.dtype)
    used.add(name)
  if config.tie_embeddings and "lm_head.weight" in weights.files:
    # a tied head saved anyway must be the embedding it is tied to
    if not np.array_equal(weights.get("lm_head.weight"), weights.get("model.embeddings.weight")):
      raise ValueError(f"{root / weights.files['lm_head.weight']}: tensor 'lm_head.weight' differs "
                       "from 'model.embeddings.weight', but config.json ties them")
    used.add("lm_head.weight")
  extra = sorted(weights.names() - used)
  if extra:
    raise ValueError(f"{root / weights.files[extra[0]]}: tensor {extra[0]!r} has no place in "
                     f"lineax_lm's model of this config.json"
                     + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
  graphdef, state = nnx.split(abstract)
  nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(params))
  tokenizer = None
  if (root / "tokenizer.json").exists() and not storage.is_remote(root):
    tokenizer = HFTokenizer(str(root / "tokenizer.json"))
  return Pretrained(nnx.merge(graphdef, state), tokenizer)


def from_fla(path, **overrides):
  """The HybridLM of `load_fla(path, **overrides)`."""
  return load_fla(path, **overrides).model


def to_fla(model, path, tokenizer=None) -> str:
  """Writes `model` to folder `path` as fla writes a checkpoint (config.json, model.safetensors in
  float32), so that fla's AutoModelForCausalLM.from_pretrained loads it; with `tokenizer` (one read
  from a tokenizer.json) its file beside them and its special ids in config.json. Returns the
  folder."""
  from safetensors.numpy import save
  from lineax_lm.models.pretrained import _flat_params
  config = model.config
  meta, norm_name = config_to_fla(config, tokenizer)
  tensors = {}
  for key, value in _flat_params(model).items():
    name, layout = fla_tensor_name(key, norm_name, config)
    tensors[name] = to_fla_layout(np.asarray(jnp.asarray(value, jnp.float32)), layout)
  root = storage.as_path(path)
  root.mkdir(parents=True, exist_ok=True)
  (root / SAFETENSORS_FILE).write_bytes(save(tensors, metadata={"format": "pt"}))
  (root / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
  source = getattr(tokenizer, "path", None)
  if source is not None:
    (root / "tokenizer.json").write_bytes(storage.as_path(source).read_bytes())
  return str(root)


def copy_tokenizer_files(source, target) -> list[str]:
  """Copies the tokenizer files (TOKENIZER_FILES) folder `source` has into `target`; returns their
  names."""
  source, target = storage.as_path(source), storage.as_path(target)
  copied = []
  for name in TOKENIZER_FILES:
    if (source / name).exists():
      (target / name).write_bytes((source / name).read_bytes())
      copied.append(name)
  return copied
