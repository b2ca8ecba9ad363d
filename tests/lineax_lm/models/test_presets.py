"""Presets: the 340M presets are within 5% of 340M parameters (counted on abstract models); the
3:1 Gated DeltaNet hybrid's cache at 32,768 tokens is at most 1/3 of the Transformer's, checked
against caches the model builds."""
import math
from collections import defaultdict

import jax
import numpy as np
import pytest
from flax import nnx

from lineax_lm.models.cache import cache_bytes, cache_report, real_cache_bytes
from lineax_lm.models.hybrid import HybridLM, abstract_model
from lineax_lm.models.presets import (PRESETS, _component, count_params, format_counts, get_preset,
                                      model_config)
from tests.lineax_lm.tiny import tiny_config

PRESETS_340M = sorted(n for n in PRESETS if n.endswith("_340m"))


def test_340m_presets_are_340m():
  assert len(PRESETS_340M) == 25  # 12 linear mixers pure + hybrid, and the Transformer
  for name in PRESETS_340M:
    counts = count_params(get_preset(name))
    print(format_counts(name, counts))
    assert abs(counts["total"] / 340e6 - 1) < 0.05, name
    assert counts["total"] == sum(counts[k] for k in ("embedding", "mixers", "mlps", "norms", "head"))


def test_fla_anchor_preset_matches_fla_gated_deltanet():
  """fla's GatedDeltaNetForCausalLM(hidden 1024, 24 layers, 4 heads x 256, expand_v 2, vocab 32000)
  has 475M parameters (counted with torch on the GPU host)."""
  counts = count_params(get_preset("gated_deltanet_340m_fla"))
  print(format_counts("gated_deltanet_340m_fla", counts))
  assert round(counts["total"] / 1e6) == 475
  assert counts["head"] == counts["embedding"] == 32000 * 1024


def test_smollm2_preset_has_the_teachers_parameter_count():
  assert count_params(get_preset("smollm2_135m"))["total"] == 134_515_008


@pytest.mark.parametrize("mixer,ratio", [("hgrn2", "3:1"), ("gated_deltanet", "pure"),
                                         ("gated_deltanet", "transformer")])
def test_count_params_equals_a_count_over_every_layer(mixer, ratio):
  """count_params counts one block per kind, once per layer of its kind: the same numbers as a
  count over every layer of the full abstract model (HGRN-2 adds the per-layer forget-gate lower
  bounds)."""
  cfg = tiny_config(mixer, num_layers=8, attn_ratio=ratio)
  want = defaultdict(int)
  for path, leaf in nnx.to_flat_state(nnx.state(abstract_model(cfg), nnx.Param)):
    n = math.prod(leaf.shape)
    want[_component(path)] += n
    want["total"] += n
    in_attention = str(path[0]) == "blocks" and int(path[1]) in cfg.attention_indices
    if in_attention and str(path[2]) == "mixer":
      want["attention"] += n
  assert count_params(cfg) == {k: want[k] for k in count_params(cfg)}


def test_hybrid_cache_is_at_most_a_third_of_the_transformer_cache_at_32k():
  ctx = 32768
  hybrid = get_preset("gated_deltanet_hybrid_340m", dtype="bfloat16")
  transformer = get_preset("transformer_340m", dtype="bfloat16")
  print(cache_report({"transformer_340m": transformer, "gated_deltanet_hybrid_340m": hybrid}, ctx))
  for cfg in (hybrid, transformer):  # the formula equals the cache the model builds
    assert cache_bytes(cfg, ctx)["total"] == real_cache_bytes(cfg, ctx)
  assert cache_bytes(transformer, ctx)["total"] == 24 * 2 * 16 * 64 * 2 * ctx
  assert cache_bytes(hybrid, ctx)["total"] <= cache_bytes(transformer, ctx)["total"] / 3


@pytest.mark.parametrize("ratio", ["3:1", "transformer", "pure"])
def test_cache_formula_matches_an_allocated_cache(ratio):
  cfg = tiny_config("gated_deltanet", num_layers=4, attn_ratio=ratio)
  model = HybridLM(cfg, nnx.Rngs(0))
  cache = model.init_cache(2, 100)
  allocated = sum(np.asarray(a).nbytes for a in jax.tree.leaves(cache["layers"]))
  assert allocated == 2 * cache_bytes(cfg, 100)["total"] == real_cache_bytes(model, 100, batch=2)


def test_the_counting_command_takes_flags_and_names_an_unknown_preset(capsys):
  from lineax_lm.models import presets
  presets.main(["--presets=gla_340m"])
  assert capsys.readouterr().out.startswith("gla_340m")
  with pytest.raises(SystemExit, match=r"^error: unknown preset 'nope'"):
    presets.main(["--presets=nope"])


def test_config_from_ml_collections():
  import ml_collections
  cd = ml_collections.ConfigDict(dict(num_layers=4, hidden=64, mixer="gla", mixer_cfg={"num_heads": 2},
                                      attn_ratio="3:1"))
  cfg = model_config(cd)
  assert cfg.attention_indices == (3,) and dict(cfg.mixer_cfg) == {"num_heads": 2}
  hash(cfg)
  with pytest.raises(ValueError, match="hiden"):
    model_config({"hiden": 3})
