"""The grid command: a 2-cell tiny grid trains (a process a cell), scores and writes its tables; a rerun skips the
finished cells (their result.json), an unfinished cell resumes from its checkpoint, and a signal
stops the grid with trainer.Interrupted before the cell's result is written."""
import dataclasses
import json
import os

import pytest

from lineax_lm.experiments import cells, grid, plots, sizes
from lineax_lm.train import trainer


@pytest.mark.slow
def test_tiny_grid_runs_skips_and_resumes(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  # The command line, both cells at once: each in a process of its own, its log in its folder.
  assert grid.main(["--size", "tiny", "--out", out, "--parallel", "2"]) == 0
  results = cells.load_results(out)
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
  for _, _, name in plots.SHARE_PLOTS:
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
  monkeypatch.setattr(grid, "score_cell", lambda cell_dir, size, scored_ruler=None: dict(scores))  # scored above
  again = grid.run_grid("tiny", out, progress=False, accelerator=False, only="transformer")
  assert len(trained) == 1 and trained[0].endswith(os.path.join("transformer", "run"))
  assert open(metrics).read() == logged                   # resumed at its last step: no step retrained
  assert again[1]["train_loss"] is not None and again[1]["tokens_per_s"] is not None  # from its log
  assert again[1]["steps"] == 6 and os.path.exists(os.path.join(out, "cells", "transformer", "result.json"))
  assert again[1]["train_seconds"] >= results[1]["train_seconds"]  # the first run's time counts too


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


def test_a_result_of_another_config_is_set_aside_and_the_cell_reruns(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  size = sizes.get_size("small")
  (cell,) = cells.build_cells("small", "hgrn:3:1", accelerator=False)
  cell_dir = os.path.join(out, "cells", cell["name"])
  os.makedirs(os.path.join(cell_dir, "run"))
  with open(os.path.join(cell_dir, "result.json"), "w") as f:  # an older grid's: no fingerprint
    json.dump(dict(name=cell["name"], heldout_bits_per_byte=2.44), f)
  trained = []
  monkeypatch.setattr(grid, "train_cell",
                      lambda config, run_dir: trained.append(run_dir) or {"step": 1, "loss": 1.0})
  monkeypatch.setattr(grid, "score_cell", lambda cell_dir, size, scored_ruler=None: dict(heldout_bits_per_byte=2.0))
  result = grid.run_cell(cell, size, out)
  assert len(trained) == 1 and result["config_fingerprint"] == cell["config_fingerprint"]
  assert result["heldout_bits_per_byte"] == 2.0 and cells.finished(out, cell)
  stale = os.path.join(out, "stale", f"{cell['name']}.unfingerprinted")
  assert json.load(open(os.path.join(stale, "result.json")))["heldout_bits_per_byte"] == 2.44
  assert grid.run_cell(cell, size, out) == result and len(trained) == 1   # same config: skipped
  (changed,) = cells.build_cells("small", "hgrn:3:1", overrides=["train.lr=1e-3"], accelerator=False)
  assert not cells.finished(out, changed)
  grid.run_cell(changed, size, out)
  assert len(trained) == 2
  assert os.path.isdir(os.path.join(out, "stale", f"{cell['name']}.{cell['config_fingerprint']}"))
  # an interrupted run of another config (no result yet) does not resume: it is set aside too
  os.remove(os.path.join(cell_dir, "result.json"))
  assert cells.set_aside_if_stale(out, cell) is not None and not os.path.exists(cell_dir)


def test_tables_refuse_results_of_two_budgets(tmp_path):
  out = str(tmp_path / "g")
  for name, budget in (("hgrn_3-1", "aaaa"), ("hgrn_pure", None)):
    os.makedirs(os.path.join(out, "cells", name))
    with open(os.path.join(out, "cells", name, "result.json"), "w") as f:
      json.dump(dict(name=name, mixer="hgrn", ratio="3:1", label="HGRN", budget_fingerprint=budget), f)
  with pytest.raises(ValueError, match="2 different budgets"):
    grid.main(["--size", "small", "--out", out, "--tables"])


def test_next_runs_only_the_first_unfinished_cells(tmp_path, monkeypatch):
  out = str(tmp_path / "g")
  ran = []

  def run_seeds(seeds, size, out_dir):  # finished cells: each result.json under its fingerprint
    for cell in seeds:
      ran.append(cell["name"])
      os.makedirs(os.path.dirname(cells.result_path(out_dir, cell)), exist_ok=True)
      with open(cells.result_path(out_dir, cell), "w") as f:
        json.dump(dict(name=cell["name"], config_fingerprint=cell["config_fingerprint"]), f)
    return [dict(heldout_bits_per_byte=2.0)] * len(seeds)

  monkeypatch.setattr(grid, "run_seeds", run_seeds)
  monkeypatch.setattr(grid, "write_outputs", lambda results, out_dir: "")
  args = dict(only="hgrn,gla:6:1,gla:3:1", corpus=cells.default_corpus(sizes.get_size("small")),
              progress=False, accelerator=False)
  grid.run_grid("small", out, next_cells=2, **args)
  assert ran == ["hgrn_24-1", "hgrn_12-1"]
  grid.run_grid("small", out, next_cells=3, **args)
  assert ran[2:] == ["hgrn_6-1", "hgrn_3-1", "hgrn_pure"]
  grid.run_grid("small", out, next_cells=3, **args)   # every cell at seed 0 before any at seed 1
  assert ran[5:] == ["gla_6-1", "gla_3-1", "gla_6-1_s1"]
  grid.run_grid("small", out, next_cells=3, **args)
  assert ran[8:] == ["gla_3-1_s1", "gla_6-1_s2", "gla_3-1_s2"]


def test_config_overrides_reach_every_cell_and_bad_ones_say_which(tmp_path, monkeypatch, capsys):
  built = []
  monkeypatch.setattr(grid, "build_cells", lambda *a, **k: built.append(a[3]) or [])
  argv = ["--size", "tiny", "--out", str(tmp_path), "--list"]
  assert grid.main(argv + ["--config.train.tokens=2.6e6", "--config.data.paths=a b.jsonl",
                           "--config.model.attn_short_conv=True"]) == 0
  config = sizes.cell_config(sizes.get_size("tiny"), "gated_deltanet", "3:1")
  cells.apply_overrides(config, built[0])
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


@pytest.mark.slow
def test_a_cells_seeds_train_as_one_population(tmp_path, monkeypatch):
  """`--population`: the seeds of a cell train in one program (trainer.train_population), and each
  seed's folder, result and scores are its own; seeds already finished are skipped."""
  monkeypatch.setitem(sizes.SIZES, "tiny", dataclasses.replace(sizes.get_size("tiny"), seeds=(0, 1, 2)))
  populations = []
  real = trainer.train_population
  monkeypatch.setattr(trainer, "train_population", lambda configs, run_dirs: populations.append(
      [c.seed for c in configs]) or real(configs, run_dirs))
  out = str(tmp_path / "g")
  args = dict(only="gated_deltanet:3:1@0,gated_deltanet:3:1@2", progress=False, accelerator=False,
              population=True)
  results = grid.run_grid("tiny", out, **args)
  assert populations == [[0, 2]]
  assert [r["name"] for r in results] == ["gated_deltanet_3-1", "gated_deltanet_3-1_s2"]
  assert all(r["steps"] == 6 and r["heldout_bits_per_byte"] > 0 for r in results)
  assert results[0]["train_loss"] != results[1]["train_loss"]   # two seeds, two runs
  args["only"] = "gated_deltanet:3:1"   # seed 1 is new: it trains alone, the others are skipped
  monkeypatch.setattr(grid, "train_cell", lambda config, run_dir: populations.append(config.seed)
                      or trainer.train_and_evaluate(config, run_dir))
  again = grid.run_grid("tiny", out, **args)
  assert populations == [[0, 2], 1] and [r["name"] for r in again] == [
      "gated_deltanet_3-1", "gated_deltanet_3-1_s1", "gated_deltanet_3-1_s2"]
