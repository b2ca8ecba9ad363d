"""The grid command: a 2-cell tiny grid trains (a process a cell), scores and writes its tables; a rerun skips the
finished cells (their result.json), an unfinished cell resumes from its checkpoint, and a signal
stops the grid with trainer.Interrupted before the cell's result is written."""
import json
import os

import pytest

from lineax_lm.experiments import grid
from lineax_lm.train import trainer


@pytest.mark.slow
def test_tiny_grid_runs_skips_and_resumes(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  # The command line, both cells at once: each in a process of its own, its log in its folder.
  assert grid.main(["--size", "tiny", "--out", out, "--parallel", "2"]) == 0
  results = grid.load_results(out)
  assert [r["name"] for r in results] == ["gated_deltanet_3-1", "transformer"]
  for r in results:
    assert f"{r['name']}: 100%" in open(os.path.join(out, "cells", r["name"], "cell.log")).read()
  for r in results:
    assert r["steps"] == 6 and r["heldout_bits_per_byte"] > 0 and 0 <= r["mqar_mean"] <= 1
    assert r["ruler_mean"] is not None and {row["task"] for row in r["ruler"]} == {"niah_single", "fwe"}
    assert r["efficiency"][0]["cache_MiB"] > 0 and r["train_flops"] > 0
  assert results[0]["attn_layers"] == [1] and results[1]["attn_layers"] == [0, 1]
  tables = open(os.path.join(out, "tables.md")).read()
  assert "| Gated DeltaNet | " in tables and "| mixer | 3:1 | Transformer |" in tables
  assert "## MQAR at 64 tokens, 4 pairs" in tables
  assert "## 2. Recall rises with the share of attention" in open(os.path.join(out, "claims.md")).read()
  for _, _, name in grid.SHARE_PLOTS:
    assert os.path.exists(os.path.join(out, name)), name
  for name in ("quality_vs_flops.png", "training_curves.png"):
    assert os.path.exists(os.path.join(out, name)), name

  trained = []
  real_train = grid.train_cell
  monkeypatch.setattr(grid, "train_cell", lambda config, run_dir: trained.append(run_dir) or real_train(config, run_dir))
  again = grid.run_grid("tiny", out, progress=False, accelerator=False)
  assert not trained and again == results                # finished cells are skipped
  os.remove(os.path.join(out, "cells", "transformer", "result.json"))
  metrics = os.path.join(out, "cells", "transformer", "run", "metrics.jsonl")
  logged = open(metrics).read()
  cell_keys = {"name", "mixer", "ratio", "attn_layers", "attention_share", "effective_ratio", "size",
               "label", "steps", "train_loss", "tokens_per_s", "train_seconds", "seconds"}
  scores = {k: v for k, v in results[1].items() if k not in cell_keys}
  monkeypatch.setattr(grid, "score_cell", lambda cell_dir, size, config: dict(scores))  # scored above
  again = grid.run_grid("tiny", out, progress=False, accelerator=False, only="transformer")
  assert len(trained) == 1 and trained[0].endswith(os.path.join("transformer", "run"))
  assert open(metrics).read() == logged                   # resumed at its last step: no step retrained
  assert again[1]["train_loss"] is not None and again[1]["tokens_per_s"] is not None  # from its log
  assert again[1]["steps"] == 6 and os.path.exists(os.path.join(out, "cells", "transformer", "result.json"))


def test_a_signal_stops_the_grid_before_the_result(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  os.makedirs(os.path.join(out, "corpus"))
  for name in ("train-00000.jsonl", "heldout.jsonl"):
    with open(os.path.join(out, "corpus", name), "w") as f:
      f.write(json.dumps({"text": "some text"}) + "\n")
  monkeypatch.setattr(trainer, "train_and_evaluate",
                      lambda config, workdir: {"stopped_by": "SIGTERM", "step": 3})
  with pytest.raises(trainer.Interrupted, match="SIGTERM at step 3"):
    grid.run_grid("tiny", out, corpus=os.path.join(out, "corpus"), progress=False, accelerator=False)
  assert not os.path.exists(os.path.join(out, "cells", "gated_deltanet_3-1", "result.json"))


def test_overrides_set_cell_fields():
  cells = grid.build_cells("small", "gla:6:1@0", overrides=["train.tokens=1.6384e6", "data.paths=/x/*.jsonl",
                                                          "train.lr=1e-3"], accelerator=False)
  (cell,) = cells
  assert cell["config"].train.steps == 100 and cell["config"].data.paths == "/x/*.jsonl"
  assert cell["config"].train.lr == 1e-3 and cell["effective_ratio"] == "7:1"
  with pytest.raises(ValueError, match="no field"):
    grid.build_cells("small", "gla:6:1@0", overrides=["train.nope=1"], accelerator=False)


def test_fingerprint_follows_what_a_cell_computes():
  (cell,) = grid.build_cells("small", "gla:6:1@0", accelerator=False)
  fp = cell["config_fingerprint"]
  same = grid.build_cells("small", "gla:6:1@0", overrides=["train.log_every=7", "data.num_threads=1"],
                          accelerator=False)[0]
  assert same["config_fingerprint"] == fp                      # logging and I/O knobs do not count
  moved = cell["config"].copy_and_resolve_references()
  moved.data.paths = ",".join("/elsewhere/" + p.rsplit("/", 1)[1] for p in moved.data.paths.split(","))
  assert grid.config_fingerprint(moved, grid.sizes_lib.get_size("small")) == fp  # a copy of the corpus
  for change in ("data.recall_mix.fraction=0.1", "train.tokens=1.6384e6", "train.lr=1e-3"):
    other = grid.build_cells("small", "gla:6:1@0", overrides=[change], accelerator=False)[0]
    assert other["config_fingerprint"] != fp
    assert other["budget_fingerprint"] != cell["budget_fingerprint"]
  cells = grid.build_cells("small", "gla,transformer", accelerator=False)  # three seeds each
  assert len({c["config_fingerprint"] for c in cells}) == len(cells) == 18
  assert len({c["budget_fingerprint"] for c in cells}) == 1     # one grid, one budget


def test_a_result_of_another_config_is_set_aside_and_the_cell_reruns(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  size = grid.sizes_lib.get_size("small")
  (cell,) = grid.build_cells("small", "hgrn:3:1", accelerator=False)
  cell_dir = os.path.join(out, "cells", cell["name"])
  os.makedirs(os.path.join(cell_dir, "run"))
  with open(os.path.join(cell_dir, "result.json"), "w") as f:  # an older grid's: no fingerprint
    json.dump(dict(name=cell["name"], heldout_bits_per_byte=2.44), f)
  trained = []
  monkeypatch.setattr(grid, "train_cell",
                      lambda config, run_dir: trained.append(run_dir) or {"step": 1, "loss": 1.0})
  monkeypatch.setattr(grid, "score_cell", lambda cell_dir, size, config: dict(heldout_bits_per_byte=2.0))
  result = grid.run_cell(cell, size, out)
  assert len(trained) == 1 and result["config_fingerprint"] == cell["config_fingerprint"]
  assert result["heldout_bits_per_byte"] == 2.0 and grid.finished(out, cell)
  stale = os.path.join(out, "stale", f"{cell['name']}.unfingerprinted")
  assert json.load(open(os.path.join(stale, "result.json")))["heldout_bits_per_byte"] == 2.44
  assert grid.run_cell(cell, size, out) == result and len(trained) == 1   # same config: skipped
  (changed,) = grid.build_cells("small", "hgrn:3:1", overrides=["train.lr=1e-3"], accelerator=False)
  assert not grid.finished(out, changed)
  grid.run_cell(changed, size, out)
  assert len(trained) == 2
  assert os.path.isdir(os.path.join(out, "stale", f"{cell['name']}.{cell['config_fingerprint']}"))
  # an interrupted run of another config (no result yet) does not resume: it is set aside too
  os.remove(os.path.join(cell_dir, "result.json"))
  assert grid.set_aside_if_stale(out, cell) is not None and not os.path.exists(cell_dir)


def test_tables_refuse_results_of_two_budgets(tmp_path):
  out = str(tmp_path / "g")
  for name, budget in (("hgrn_3-1", "aaaa"), ("hgrn_pure", None)):
    os.makedirs(os.path.join(out, "cells", name))
    with open(os.path.join(out, "cells", name, "result.json"), "w") as f:
      json.dump(dict(name=name, mixer="hgrn", ratio="3:1", label="HGRN", budget_fingerprint=budget), f)
  with pytest.raises(ValueError, match="2 different budgets"):
    grid.main(["--size", "small", "--out", out, "--tables"])


def test_tables_order_mixers_and_ratios_as_the_study_does():
  # results in the order cells happen to finish: the tables still read 24:1 ... pure, then the
  # Transformer, and the mixers in the study's order
  cells = [("gla", "pure"), ("transformer", "transformer"), ("hgrn", "6:1"), ("gla", "24:1")]
  results = [dict(name=f"{m}_{r}", mixer=m, ratio=r, label=grid.sizes_lib.label(m), size="small",
                  heldout_bits_per_byte=2.0 + i / 10) for i, (m, r) in enumerate(cells)]
  table = grid.tables_markdown(results).split("## Held-out bits per byte")[1]
  assert "| mixer | 24:1 | 6:1 | pure | Transformer |" in table
  assert table.index("| HGRN | ") < table.index("| GLA | ") < table.index("| Transformer | -")
  assert "| GLA | 2.300 | - | 2.000 | - |" in table


def test_the_recipes_differ_in_attention_convolutions_and_recall_rows_only():
  def cell(size):
    (c,) = grid.build_cells(size, "gla:6:1@0", accelerator=True)
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
  (cell,) = grid.build_cells("small_recall", "hgrn:3:1", accelerator=False)
  assert cell["config"].data.recall_mix.fraction > 0              # training mixes recall rows in
  docs = make_source(grid.heldout_config(cell["config"]), seed=0)  # what bits per byte scores
  with gzip.open(cell["config"].data.heldout_paths, "rt") as f:
    heldout = [json.loads(line)["text"] for line in f if line.strip()]
  assert [docs[i] for i in range(len(docs))] == heldout and len(heldout) == 24


@pytest.mark.parametrize("size", ["small_conv_recall", "small_recall"])
def test_the_committed_small_cells_are_finished_cells_of_the_current_config(size):
  """results/hybrid_<size> holds the cells the H200 has run, in the grid's layout, and the next call
  resumes from them (launch/hybrid_study_h200.sh, RESULTS_IN): a change to a cell's config, the
  size or their defaults (any field added) changes the fingerprints, and the grid would set every
  committed cell aside and run it again. Such a change fails here first."""
  out = os.path.join(os.path.dirname(__file__), "..", "..", "..", "results", f"hybrid_{size}")
  results = grid.load_results(out)
  assert results, out
  names = ",".join(grid.sizes_lib.cell_flag(r["mixer"], r["ratio"], r["seed"]) for r in results)
  cells = grid.build_cells(size, names, accelerator=True)  # as on the H200
  assert [c["name"] for c in cells] == [r["name"] for r in results]
  for cell in cells:
    assert grid.finished(out, cell), cell["name"]
  grid.check_one_budget(results)


def test_next_runs_only_the_first_unfinished_cells(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  ran = []

  def run_cell(cell, size, out_dir):  # a finished cell: its result.json under its fingerprint
    ran.append(cell["name"])
    os.makedirs(os.path.dirname(grid.result_path(out_dir, cell)), exist_ok=True)
    with open(grid.result_path(out_dir, cell), "w") as f:
      json.dump(dict(name=cell["name"], config_fingerprint=cell["config_fingerprint"]), f)
    return dict(heldout_bits_per_byte=2.0)

  monkeypatch.setattr(grid, "run_cell", run_cell)
  monkeypatch.setattr(grid, "write_outputs", lambda results, out_dir: "")
  args = dict(only="hgrn,gla:6:1", corpus=grid.default_corpus(grid.sizes_lib.get_size("small")),
              progress=False, accelerator=False)
  grid.run_grid("small", out, next_cells=2, **args)
  assert ran == ["hgrn_24-1", "hgrn_12-1"]
  grid.run_grid("small", out, next_cells=3, **args)
  assert ran[2:] == ["hgrn_6-1", "hgrn_3-1", "hgrn_pure"]
  grid.run_grid("small", out, next_cells=3, **args)
  assert ran[5:] == ["gla_6-1", "gla_6-1_s1", "gla_6-1_s2"]


def test_config_overrides_reach_every_cell_and_bad_ones_say_which(tmp_path, monkeypatch, capsys):
  built = []
  monkeypatch.setattr(grid, "build_cells", lambda *a, **k: built.append(a[3]) or [])
  argv = ["--size", "tiny", "--out", str(tmp_path), "--list"]
  assert grid.main(argv + ["--config.train.tokens=2.6e6", "--config.data.paths=a b.jsonl",
                           "--config.model.attn_short_conv=True"]) == 0
  config = grid.sizes_lib.cell_config(grid.sizes_lib.get_size("tiny"), "gated_deltanet", "3:1")
  grid.apply_overrides(config, built[0])
  assert config.train.tokens == 2_600_000 and isinstance(config.train.tokens, int)
  assert config.data.paths == "a b.jsonl" and config.model.attn_short_conv is True
  for bad, message in ((["--config.train.tokenz=1"], "--config.train.tokenz: the config has no field"),
                       (["--config.train.tokens=many"], "flag --config.train.tokens=many:"),
                       (["--parallel=0"], "flag --parallel=0:"), (["--set", "train.tokens=1"], "set")):
    with pytest.raises(SystemExit, match=message) as e:
      grid.main(argv + bad)
    assert "\n" not in str(e.value.code)
  with pytest.raises(SystemExit, match="flag --size=None"):
    grid.main(["--out", str(tmp_path)])
