"""Model presets at the source papers' two scales, and a parameter counter.

  "<mixer>_340m"          hidden 1024, 24 layers, vocab 32,000, tied embeddings, pure <mixer>
  "<mixer>_1.3b"          hidden 2048, 24 layers
  "<mixer>_hybrid_340m"   the same with attention at every 4th layer ("3:1": layers 3, 7, ..., 23)
  "<mixer>_hybrid_1.3b"
  "transformer_340m" / "transformer_1.3b"   Llama-style (16 heads, SwiGLU 2816 / 5632)
  "smollm2_135m"           the distillation teacher (SmolLM2-135M): an all-attention HybridLM is a Llama
  "gated_deltanet_340m_fla"  fla's GatedDeltaNetForCausalLM as timed in the H200 anchor (4 heads x 256,
                           expand_v 2, untied embeddings, norm_eps 1e-6): 475M parameters, not 340M.

Each mixer's widths (heads, expand ratios, MLP width) follow fla's layer defaults but are chosen so
that a block has about the parameters of a Transformer block (4 D^2 mixer + SwiGLU), as the papers do
when they compare at equal size: e.g. Gated DeltaNet uses num_heads * head_dim = D / 2 (expand_v 2),
RetNet and mLSTM (mixers of 8 D^2 and 6 D^2) get a narrower MLP in their blocks (attention blocks
of the hybrids keep the standard one).

    python -m lineax_lm.models.presets            # per-component parameter counts of every preset

`model_config(section)` reads a config file's model section (a preset and overrides) as a
ModelConfig.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

from flax import nnx

from lineax_lm.layers import LINEAR_MIXERS
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import abstract_model_one_block_per_kind
from lineax_lm.models.placement import PLACEMENTS, spread_attention_layers

SCALES = {
    "340m": dict(vocab_size=32000, num_layers=24, hidden=1024, heads=16, tie_embeddings=True),
    "1.3b": dict(vocab_size=32000, num_layers=24, hidden=2048, heads=16, tie_embeddings=True),
}

# mixer -> scale -> (mixer_cfg overrides, MLP width of the linear blocks; None: fla's 8/3 rule)
MIXER_SIZES = {
    "linear_attn": {"340m": ({"num_heads": 8}, None), "1.3b": ({"num_heads": 16}, None)},
    "retention": {"340m": ({"num_heads": 8}, 1536), "1.3b": ({"num_heads": 8}, 2816)},
    "simple_gla": {"340m": ({"num_heads": 4, "expand_k": 0.5}, None),
                   "1.3b": ({"num_heads": 4, "expand_k": 0.5}, None)},
    "mamba2": {"340m": ({"num_heads": 4, "expand_k": 0.5}, None),
               "1.3b": ({"num_heads": 4, "expand_k": 0.5}, None)},
    "gla": {"340m": ({"num_heads": 4}, None), "1.3b": ({"num_heads": 4}, None)},
    "hgrn": {"340m": ({}, None), "1.3b": ({}, None)},
    "hgrn2": {"340m": ({"expand_ratio": 128}, None), "1.3b": ({"expand_ratio": 128}, None)},
    "deltanet": {"340m": ({"num_heads": 8}, None), "1.3b": ({"num_heads": 16}, None)},
    "gated_deltanet": {"340m": ({"num_heads": 2, "head_dim": 256}, None),
                       "1.3b": ({"num_heads": 4, "head_dim": 256}, None)},
    "kda": {"340m": ({"num_heads": 8, "head_dim": 128}, None),
            "1.3b": ({"num_heads": 16, "head_dim": 128}, None)},
    "rwkv6": {"340m": ({"num_heads": 4}, None), "1.3b": ({"num_heads": 8}, None)},
    "mlstm": {"340m": ({"num_heads": 4}, 2048), "1.3b": ({"num_heads": 4}, 4096)},
}


KEY_VALUE_HEADS = ("gated_deltanet", "kda")                     # head_dim, expand_v
EXPAND_KV = ("linear_attn", "retention", "simple_gla", "mamba2", "gla", "deltanet", "rwkv6")


def equal_state_mixer_cfg(mixer: str, width: int, heads: int) -> dict:
  """Mixer options giving a state of `heads` x (width / heads) x (width / heads) per layer."""
  if width % heads:
    raise ValueError(f"width {width} is not divisible by `heads` = {heads}")
  d = width // heads
  if mixer in KEY_VALUE_HEADS:
    return dict(num_heads=heads, head_dim=d, expand_v=1.0)
  if mixer in EXPAND_KV:
    return dict(num_heads=heads, expand_k=1.0, expand_v=1.0)
  if mixer == "hgrn2":
    return dict(expand_ratio=d)
  if mixer == "mlstm":
    return dict(num_heads=heads, proj_factor=1.0, round_to=1)
  return {}  # hgrn: an elementwise state of width D


def _build_presets() -> dict:
  presets = {}
  for scale, base in SCALES.items():
    presets[f"transformer_{scale}"] = ModelConfig(**base, attn_ratio="transformer")
    for mixer in LINEAR_MIXERS:
      mixer_cfg, mlp_hidden = MIXER_SIZES[mixer][scale]
      cfg = ModelConfig(**base, mixer=mixer, mixer_cfg=mixer_cfg, linear_mlp_hidden=mlp_hidden)
      presets[f"{mixer}_{scale}"] = cfg
      presets[f"{mixer}_hybrid_{scale}"] = cfg.replace(attn_ratio="3:1")
  # The distillation teacher's architecture (SmolLM2-135M, a Llama): 134,515,008 parameters.
  presets["smollm2_135m"] = ModelConfig(
      vocab_size=49152, num_layers=30, hidden=576, heads=9, kv_heads=3, mlp_hidden=1536,
      attn_ratio="transformer", tie_embeddings=True, rope_theta=100000.0, norm_eps=1e-5)
  presets["gated_deltanet_340m_fla"] = ModelConfig(
      vocab_size=32000, num_layers=24, hidden=1024, mixer="gated_deltanet",
      mixer_cfg={"num_heads": 4, "head_dim": 256, "expand_v": 2.0}, tie_embeddings=False, norm_eps=1e-6)
  return presets


PRESETS = _build_presets()


def get_preset(name: str, **overrides) -> ModelConfig:
  """A preset by name, with ModelConfig field overrides (e.g. dtype="bfloat16", backend="xla")."""
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]



def model_config(section) -> ModelConfig:
  """The ModelConfig of a config file's model section: an ml_collections ConfigDict (or any
  mapping) with a subset of ModelConfig's fields. A `preset` key naming one of PRESETS starts from
  that preset; the other keys then override it, except those left None (a preset-based config,
  lineax_lm.train.config.lm_config, leaves every field it does not set None). `attn_placement`
  ("periodic" or "spread", `PLACEMENTS`) says how the ratio places its attention layers."""
  d = dict(section.to_dict() if hasattr(section, "to_dict") else section)
  preset = d.pop("preset", None)
  placement = d.pop("attn_placement", None) or "periodic"
  if placement not in PLACEMENTS:
    raise ValueError(f"`attn_placement` must be one of {PLACEMENTS}; got {placement!r}")
  names = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"unknown model config key(s) {unknown}; known: {sorted(names)}")
  if not preset:
    return ModelConfig(**_placed(d, placement))
  overrides = {k: v for k, v in d.items() if v is not None and not (k == "mixer_cfg" and not v)}
  base = get_preset(preset)
  if "mixer_cfg" in overrides:  # options added to the preset's, not replacing them
    overrides["mixer_cfg"] = {**dict(base.mixer_cfg), **dict(overrides["mixer_cfg"])}
  if "attn_ratio" in overrides and "attn_layers" not in overrides:
    overrides["attn_layers"] = None  # a preset's explicit layers give way to a ratio given here
  fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ModelConfig)} | overrides
  return ModelConfig(**_placed(fields, placement))


def _placed(fields: dict, placement: str) -> dict:
  """ModelConfig `fields` with the ratio's layers listed by `spread_attention_layers` when
  `placement` is "spread" (and no explicit attn_layers are given)."""
  if placement == "spread" and fields.get("attn_layers") is None:
    layers = fields.get("num_layers", ModelConfig.num_layers)
    ratio = fields.get("attn_ratio", ModelConfig.attn_ratio)
    return {**fields, "attn_layers": spread_attention_layers(layers, ratio)}
  return fields

def _component(path: tuple) -> str:
  head = str(path[0])
  if head == "embed":
    return "embedding"
  if head == "lm_head":
    return "head"
  if head in ("norm", "embed_norm"):
    return "norms"
  if head == "lower_bounds":
    return "mixers"
  part = str(path[2])  # blocks, index, part
  return {"attn_norm": "norms", "mlp_norm": "norms", "mlp": "mlps"}.get(part, "mixers")


def count_params(config: ModelConfig) -> dict:
  """Parameter counts per component {embedding, mixers, attention, mlps, norms, head, total}, from
  an abstract model (nothing is allocated) with one block per kind (linear mixer, attention), each
  counted once per layer of its kind. "attention" is the part of "mixers" in attention layers."""
  model = abstract_model_one_block_per_kind(config)
  attention = set(config.attention_indices)
  layers_of_kind = {True: len(attention), False: config.num_layers - len(attention)}
  counts = defaultdict(int)
  for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    n = math.prod(leaf.shape)
    comp = _component(path)
    if str(path[0]) == "blocks":
      is_attention = int(path[1]) in attention
      n *= layers_of_kind[is_attention]
      if comp == "mixers" and is_attention:
        counts["attention"] += n
    counts[comp] += n
  counts["total"] = sum(v for k, v in counts.items() if k != "attention")
  return {k: counts.get(k, 0) for k in ("embedding", "mixers", "attention", "mlps", "norms", "head",
                                         "total")}


def format_counts(name: str, counts: dict) -> str:
  m = lambda k: f"{counts[k] / 1e6:8.2f}M"
  return (f"{name:30s} total {m('total')} | embedding {m('embedding')} mixers {m('mixers')} "
          f"(attention {m('attention')}) mlps {m('mlps')} norms {m('norms')} head {m('head')}")


def define_flags(fv, argv) -> None:
  from absl import flags
  del argv
  flags.DEFINE_list("presets", sorted(PRESETS), "the presets whose parameters are counted",
                    flag_values=fv)


def main(argv=None):
  """python -m lineax_lm.models.presets [--presets=a,b]: each preset's parameter count by part."""
  from lineax_lm import cli
  a = cli.parse(define_flags, argv, "python -m lineax_lm.models.presets", main.__doc__)
  for name in a.presets:
    try:
      counts = count_params(get_preset(name))
    except ValueError as e:   # an unknown preset names the ones there are
      cli.fail(e)
    print(format_counts(name, counts), flush=True)


if __name__ == "__main__":
  main()
