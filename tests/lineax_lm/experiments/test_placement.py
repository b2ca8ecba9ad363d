"""Ratios that mean what they say: the spread placement, the effective ratio, the warning where the
periodic placement collapses two ratios, and preset-based LM configs with a token budget."""
import warnings

import pytest

from lineax_lm.experiments import sizes
from lineax_lm.models.placement import attention_layers, effective_ratio, spread_attention_layers
from lineax_lm.models.presets import model_config
from lineax_lm.train.config import lm_config


def test_the_five_ratios_are_five_models_at_the_study_depth():
  placed = {r: spread_attention_layers(24, r) for r in sizes.RATIOS}
  assert placed == {"24:1": (23,), "12:1": (11, 23), "6:1": (7, 15, 23),
                    "3:1": (3, 7, 11, 15, 19, 23), "pure": ()}
  assert [effective_ratio(24, placed[r]) for r in sizes.RATIOS] == ["23:1", "11:1", "7:1", "3:1", "pure"]
  assert effective_ratio(24, range(24)) == "transformer" and effective_ratio(20, (6, 12, 19)) == "5.67:1"
  # where the periodic placement is exact, the two agree
  assert spread_attention_layers(24, "3:1") == attention_layers(24, "3:1")
  assert spread_attention_layers(4, "3:1") == attention_layers(4, "3:1") == (3,)
  assert spread_attention_layers(8, "transformer") == tuple(range(8))
  with pytest.raises(ValueError, match="attn_ratio"):
    spread_attention_layers(24, "x:1")


def test_a_periodic_ratio_that_collapses_warns_with_its_effective_ratio():
  with pytest.warns(UserWarning, match=r"'12:1' at 24 layers places 1 .*effective 23:1.*\[11, 23\]"):
    assert attention_layers(24, "12:1") == (12,)
  with warnings.catch_warnings():
    warnings.simplefilter("error")                 # exact placements stay silent
    attention_layers(24, "3:1"), attention_layers(24, "24:1"), attention_layers(4, "3:1")
    assert spread_attention_layers(3, "6:1") == (2,) and spread_attention_layers(7, "1:1") == (1, 3, 4, 6)
  # An odd depth at "1:1" (the periodic count rounds down, the asked one up) warns once, naming the
  # spread placement: building that message used to call attention_layers again, without end.
  with pytest.warns(UserWarning, match=r"'1:1' at 3 layers places 1 .*\[1, 2\]"):
    assert attention_layers(3, "1:1") == (1,)


def test_an_lm_config_names_a_preset_and_a_token_budget():
  c = lm_config("gated_deltanet_340m", tokens=1_048_576_000)
  c.model.attn_ratio = "12:1"
  with warnings.catch_warnings():
    warnings.simplefilter("error")                 # spread placement: no collapse, no warning
    m = model_config(c.model)
  assert (m.mixer, m.hidden, m.num_layers, m.attn_layers) == ("gated_deltanet", 1024, 24, (11, 23))
  assert dict(m.mixer_cfg) == {"num_heads": 2, "head_dim": 256}
  assert c.train.steps == 1_048_576_000 // (256 * 2048) == 2000 and c.train.warmup_steps == 62
  c.train.tokens, c.data.seq_len = 2 * 1_048_576_000, 1024      # the steps follow the budget
  assert c.train.steps == 8000 and c.train.checkpoint_every == 2000
  c.model.attn_placement = "periodic"
  with pytest.warns(UserWarning, match="collapse|coincide"):
    assert model_config(c.model).attention_indices == (12,)
  c.model.mixer_cfg = {"use_short_conv": False}
  c.model.attn_placement = "spread"
  assert dict(model_config(c.model).mixer_cfg)["num_heads"] == 2   # added, not replaced
  with pytest.raises(ValueError, match="unknown preset"):
    model_config({"preset": "nope"})
  with pytest.raises(ValueError, match="attn_placement"):
    model_config({"attn_placement": "random"})


def test_grid_cells_and_only():
  small = sizes.get_size("small")
  cells = sizes.all_cells(small)
  # the seeded mixers (GLA, RetNet, HGRN-2, Gated DeltaNet, the Transformer) at three seeds
  assert len(cells) == 2 * 5 + 4 * 5 * 3 + 3 and cells[-3:] == [(*sizes.TRANSFORMER, s) for s in (0, 1, 2)]
  assert len(sizes.all_cells(sizes.get_size("small_conv_recall"))) == 31
  assert sizes.parse_cells("gla:6:1,transformer@1,hgrn", small) == [
      ("hgrn", r, 0) for r in sizes.RATIOS] + [("gla", "6:1", s) for s in (0, 1, 2)] + [
          (*sizes.TRANSFORMER, 1)]
  assert [sizes.cell_name(*c) for c in sizes.parse_cells("gla:6:1@2,transformer@0", small)] == [
      "gla_6-1_s2", "transformer"]
  for bad in ("gla:5:1", "hgrn:pure@1", "gla@x"):
    with pytest.raises(ValueError, match="names no cell|must be an integer"):
      sizes.parse_cells(bad, small)
  assert sizes.cell_config(small, "gla", "6:1", seed=2).seed == 2
  c = sizes.cell_config(small, "hgrn2", "12:1", accelerator=True)
  assert sizes.placement(c) == dict(attn_layers=[11, 23], attention_share=2 / 24, effective_ratio="11:1")
  m = model_config(c.model)
  assert (m.hidden, m.vocab_size, m.dtype, dict(m.mixer_cfg)) == (256, 259, "bfloat16", {"expand_ratio": 32})
  big = sizes.cell_config(sizes.get_size("340m"), "gla", "6:1")
  assert model_config(big.model).attn_layers == (7, 15, 23)
  assert big.train.steps == 20_000_000_000 // (256 * 2048)


def test_the_lm_config_file_takes_preset_overrides():
  import os
  from lineax_lm.train.__main__ import load_config_file
  root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
  c = load_config_file(os.path.join(root, "configs", "lm.py"))
  c.model.preset, c.model.attn_ratio, c.train.tokens = "gla_1.3b", "6:1", 2_097_152_000
  m = model_config(c.model)
  assert (m.mixer, m.hidden, m.attn_layers, c.train.steps) == ("gla", 2048, (7, 15, 23), 4000)
  cell = load_config_file(os.path.join(root, "configs", "hybrid_study.py") + ":small,hgrn,24:1")
  assert sizes.placement(cell)["effective_ratio"] == "23:1" and cell.train.steps == 1920
