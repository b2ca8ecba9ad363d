"""The paper-table command on fla's own checkpoints (the committed fixtures, given a tokenizer):
it scores each folder, writes the grid's tables and plots, skips a folder already scored, and
refuses a folder it cannot score with one line naming it."""
import json
import os
import re
import shutil

import pytest

from lineax_lm.experiments import cells, fla_table, plots, sizes
from lineax_lm.experiments.cells import load_results
from lineax_lm.experiments.corpus import shipped_corpus
from lineax_lm.experiments.scoring import heldout_documents

FIXTURES = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, "convert", "fixtures"))
CHARACTERS = " abcdefghijklmnopqrstuvwxyz0123456789.,;:'\"!?()-\n"


def write_char_tokenizer(folder: str) -> None:
  """A character-level tokenizer.json of 53 tokens (lowercased text, `<unk>` for the rest), one
  that fits the fixtures' 64-token vocabulary."""
  import tokenizers
  from tokenizers import decoders, models, normalizers
  vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *CHARACTERS])}
  tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
  tokenizer.normalizer = normalizers.Lowercase()
  tokenizer.decoder = decoders.Fuse()
  tokenizer.add_special_tokens(["<s>", "</s>"])
  tokenizer.save(os.path.join(folder, "tokenizer.json"))


def short_corpus(tmp_path) -> str:
  """A corpus folder of a few short held-out documents (the shipped corpus's run to 9,000
  characters: minutes of windows on a CPU)."""
  folder = tmp_path / "corpus"
  folder.mkdir()
  docs = ["The cat sat on the mat. It was a sunny day, and the cat was happy.",
          "Numbers: 1, 2, 3. Letters: a, b, c! Is this (a) test? Yes; it is."]
  for name in ("train-00000.jsonl", "heldout.jsonl"):
    (folder / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  return str(folder)


def released(tmp_path, *fixtures) -> str:
  """Copies of fixture folders under names like the paper's, each with a tokenizer; their parent."""
  parent = tmp_path / "models"
  for fixture, name in fixtures:
    shutil.copytree(os.path.join(FIXTURES, fixture), parent / name)
    write_char_tokenizer(str(parent / name))
  return str(parent)


def test_the_table_of_fla_checkpoints(tmp_path, capsys):
  models = released(tmp_path, ("gated_deltanet_hybrid", "tiny-GatedDeltaNet-hybrid-3-1"),
                    ("hgrn_hybrid", "tiny-HGRN-hybrid-3-1"))
  out = str(tmp_path / "table")
  argv = ["--checkpoints", os.path.join(models, "tiny-*"), "--out", out, "--size", "tiny",
          "--corpus", short_corpus(tmp_path)]
  assert fla_table.main(argv) == 0
  printed = capsys.readouterr().out
  assert "[1/2] tiny-GatedDeltaNet-hybrid-3-1: Gated DeltaNet 3:1, held-out bits per byte" in printed
  assert "[2/2] tiny-HGRN-hybrid-3-1: HGRN 3:1" in printed
  results = load_results(out)
  assert [(r["name"], r["mixer"], r["ratio"], r["attn_layers"]) for r in results] == [
      ("tiny-HGRN-hybrid-3-1", "hgrn", "3:1", [3]),
      ("tiny-GatedDeltaNet-hybrid-3-1", "gated_deltanet", "3:1", [3])]
  for r in results:
    assert r["heldout_bits_per_byte"] > 0 and 0 <= r["mqar_mean"] <= 1
    assert {row["task"] for row in r["ruler"]} == {"niah_single", "fwe"}
    assert r["efficiency"][0]["cache_MiB"] > 0 and r["train_flops"] is None
  tables = open(os.path.join(out, "tables.md")).read()
  assert "| mixer | 3:1 |" in tables and "| HGRN | " in tables and "| Gated DeltaNet | " in tables
  assert "## MQAR at 64 tokens, 4 pairs" in tables
  for _, _, name in plots.SHARE_PLOTS:
    assert os.path.exists(os.path.join(out, name)), name
  for name in ("quality_vs_flops.png", "training_curves.png"):  # no training FLOPs, no run here
    assert not os.path.exists(os.path.join(out, name)), name

  assert fla_table.main(argv) == 0                      # scored folders are kept, not rescored
  printed = capsys.readouterr().out
  assert "[1/2] tiny-GatedDeltaNet-hybrid-3-1: scored before, kept" in printed
  assert "[2/2] tiny-HGRN-hybrid-3-1: scored before, kept" in printed and "scoring" not in printed
  assert load_results(out) == results


def test_a_folder_it_cannot_score_is_one_line(tmp_path):
  out = str(tmp_path / "table")
  bare = os.path.join(FIXTURES, "gla_hybrid")
  with pytest.raises(SystemExit, match=rf"error: {re.escape(bare)} has no tokenizer.json"):
    fla_table.main(["--checkpoints", bare, "--out", out, "--size", "tiny"])
  with pytest.raises(SystemExit, match=rf"error: `--checkpoints`: {re.escape(str(tmp_path))} is not an fla "
                                       "checkpoint: it has no config.json"):
    fla_table.main(["--checkpoints", str(tmp_path), "--out", out])
  with pytest.raises(SystemExit, match=r"error: `--checkpoints`: '/nowhere/\*' matches no folder"):
    fla_table.main(["--checkpoints", "/nowhere/*", "--out", out])


def test_nominal_ratio_is_the_nearest_study_ratio():
  assert fla_table.nominal_ratio(4, [3]) == "3:1"
  assert [fla_table.nominal_ratio(24, range(n)) for n in (0, 1, 2, 3, 6, 24)] == [
      "pure", "24:1", "12:1", "6:1", "3:1", "transformer"]


def test_the_heldout_text_is_the_small_grids():
  small = sizes.get_size("small")
  cell = cells.build_cells("small", "gla:3:1@0", accelerator=False)[0]["config"]
  grids = heldout_documents(cells.heldout_config(cell), small.ppl_documents)
  data = fla_table.heldout_data(small, shipped_corpus(fla_table.HELDOUT_CORPUS))
  assert grids and heldout_documents(data, small.ppl_documents) == grids
