"""The needle curve: a cell's needle tasks at every kept checkpoint mark (the tiny grid's
Transformer with two), written to its folder, resumed without scoring a checkpoint twice, and read
into the grid's tables and plot."""
import json
import os

import pytest

from lineax_lm.experiments import cells, scoring, sizes, tables
from lineax_lm.train.trainer import train_and_evaluate


@pytest.fixture(scope="module")
def trained_cell(tmp_path_factory):
  """<out>/cells/transformer/run: the tiny Transformer, 6 steps, its checkpoints at 3 and 6 kept."""
  from lineax_lm.experiments.corpus import make_corpus
  out = str(tmp_path_factory.mktemp("grid"))
  corpus = os.path.join(out, "corpus")
  make_corpus(corpus, **sizes.get_size("tiny").sampled_corpus, progress=False)
  (cell,) = cells.build_cells("tiny", "transformer", corpus, accelerator=False,
                              overrides=["train.checkpoint_every=3", "train.keep_checkpoints=0"])
  cell_dir = os.path.join(out, "cells", cell["name"])
  train_and_evaluate(cell["config"], os.path.join(cell_dir, "run"))
  return out, cell_dir


def test_the_curve_scores_every_kept_checkpoint_once(trained_cell, monkeypatch):
  out, cell_dir = trained_cell
  size = sizes.get_size("tiny")
  assert scoring.curve_steps(os.path.join(cell_dir, "run")) == [3, 6]
  curve = scoring.score_needle_curve(cell_dir, size, progress=False)
  assert [(p["step"], p["tokens"]) for p in curve["points"]] == [(3, 3 * 8 * 64), (6, 6 * 8 * 64)]
  assert curve["settings"]["tasks"] == ["niah_single"]          # tiny's needle tasks (not fwe)
  assert (curve["mixer"], curve["ratio"], curve["seed"]) == ("transformer", "transformer", 0)
  for point in curve["points"]:
    (row,) = point["ruler"]
    assert (row["task"], row["length"]) == ("niah_single", 384) and 0 <= row["accuracy"] <= 1
  path = os.path.join(cell_dir, cells.NEEDLE_CURVE_FILE)
  assert json.load(open(path)) == curve

  scored = []
  real = scoring.ruler_rows
  monkeypatch.setattr(scoring, "ruler_rows", lambda *a, **k: scored.append(a) or real(*a, **k))
  assert scoring.score_needle_curve(cell_dir, size, progress=False) == curve and not scored
  kept = dict(curve, points=curve["points"][:1])              # stopped after its first checkpoint
  json.dump(kept, open(path, "w"))
  assert scoring.score_needle_curve(cell_dir, size, progress=False) == curve and len(scored) == 1
  assert cells.load_needle_curves(out) == [curve]


def test_the_tables_and_the_plot_read_the_curves(trained_cell):
  out, cell_dir = trained_cell
  # scored here too: under pytest-xdist the test above may run in another worker, with a fixture
  # of its own (in the same worker the curve is read back, nothing scored again)
  scoring.score_needle_curve(cell_dir, sizes.get_size("tiny"), progress=False)
  curve = cells.load_needle_curves(out)[0]
  md = tables.needle_curve_markdown([curve])
  assert "## Needle accuracy against training tokens: niah_single" in md
  assert "| line | 1,536 | 3,072 |" in md and "| Transformer, 384 tokens | " in md
  assert "(no finished cells)" in tables.write_outputs([], out)  # cells still training: curves
  assert os.path.exists(os.path.join(out, "needle_curve.png"))
