"""A grid's cells: overrides reach their configs, fingerprints follow what a cell computes, the
recipes differ where they say, the scores read held-out text, and the committed results are
finished cells of the current config."""
import json
import os

import pytest

from lineax_lm.experiments import cells, sizes


def test_overrides_set_cell_fields():
  built = cells.build_cells("small", "gla:6:1@0", overrides=["train.tokens=1.6384e6", "data.paths=/x/*.jsonl",
                                                          "train.lr=1e-3"], accelerator=False)
  (cell,) = built
  assert cell["config"].train.steps == 100 and cell["config"].data.paths == "/x/*.jsonl"
  assert cell["config"].train.lr == 1e-3 and cell["effective_ratio"] == "7:1"
  with pytest.raises(ValueError, match="no field"):
    cells.build_cells("small", "gla:6:1@0", overrides=["train.nope=1"], accelerator=False)


def test_fingerprint_follows_what_a_cell_computes():
  (cell,) = cells.build_cells("small", "gla:6:1@0", accelerator=False)
  fp = cell["config_fingerprint"]
  same = cells.build_cells("small", "gla:6:1@0", overrides=["train.log_every=7", "data.num_threads=1"],
                          accelerator=False)[0]
  assert same["config_fingerprint"] == fp                      # logging and I/O knobs do not count
  moved = cell["config"].copy_and_resolve_references()
  moved.data.paths = ",".join("/elsewhere/" + p.rsplit("/", 1)[1] for p in moved.data.paths.split(","))
  assert cells.config_fingerprint(moved, sizes.get_size("small")) == fp  # a copy of the corpus
  for change in ("data.recall_mix.fraction=0.1", "train.tokens=1.6384e6", "train.lr=1e-3"):
    other = cells.build_cells("small", "gla:6:1@0", overrides=[change], accelerator=False)[0]
    assert other["config_fingerprint"] != fp
    assert other["budget_fingerprint"] != cell["budget_fingerprint"]
  built = cells.build_cells("small", "gla,transformer", accelerator=False)  # three seeds each
  assert len({c["config_fingerprint"] for c in built}) == len(built) == 18
  assert len({c["budget_fingerprint"] for c in built}) == 1     # one grid, one budget


def test_the_recipes_differ_in_attention_convolutions_and_recall_rows_only():
  def cell(size):
    (c,) = cells.build_cells(size, "gla:6:1@0", accelerator=True)
    return c["config"]
  small, recall, conv = cell("small"), cell("small_recall"), cell("small_conv_recall")
  assert not small.model.attn_short_conv and small.data.recall_mix.fraction == 0
  assert not recall.model.attn_short_conv and recall.data.recall_mix.fraction == 0.5
  assert conv.model.attn_short_conv and conv.data.recall_mix.to_dict() == recall.data.recall_mix.to_dict()
  recall.model.attn_short_conv = True
  assert recall.to_dict() == conv.to_dict()


def test_small_cells_score_heldout_text_only():
  import gzip
  from lineax_lm.data.pipeline import make_source
  (cell,) = cells.build_cells("small_recall", "hgrn:3:1", accelerator=False)
  assert cell["config"].data.recall_mix.fraction > 0              # training mixes recall rows in
  docs = make_source(cells.heldout_config(cell["config"]), seed=0)  # what bits per byte scores
  with gzip.open(cell["config"].data.heldout_paths, "rt") as f:
    heldout = [json.loads(line)["text"] for line in f if line.strip()]
  assert [docs[i] for i in range(len(docs))] == heldout and len(heldout) == 24


@pytest.mark.parametrize("size", ["small_conv_recall", "small_recall", "small"])
def test_the_committed_small_cells_are_finished_cells_of_the_current_config(size):
  """results/hybrid_<size> holds the cells the H200 has run, in the grid's layout, and the next call
  resumes from them (launch/hybrid_study_h200.sh, RESULTS_IN): a change to a cell's config, the
  size or their defaults (any field added) changes the fingerprints, and the grid would set every
  committed cell aside and run it again. Such a change fails here first."""
  out = os.path.join(os.path.dirname(__file__), "..", "..", "..", "results", f"hybrid_{size}")
  results = cells.load_results(out)
  assert results, out
  names = ",".join(sizes.cell_flag(r["mixer"], r["ratio"], r["seed"]) for r in results)
  built = cells.build_cells(size, names, accelerator=True)  # as on the H200
  assert [c["name"] for c in built] == [r["name"] for r in results]
  for cell in built:
    assert cells.finished(out, cell), cell["name"]
  cells.check_one_budget(results)
