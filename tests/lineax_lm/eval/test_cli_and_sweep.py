"""End to end on tiny models: a 2-point sweep (resumable, tables, plots) whose first point's checkpoint
the eval CLI then restores and evaluates; efficiency formulas and cache bytes."""
import importlib.util
import json
import os

import pytest

from lineax_lm.eval import efficiency, report, sweep
from lineax_lm.eval.__main__ import main as eval_main
from lineax_lm.models.config import ModelConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def tiny_sweep():
  """configs/mqar_sweep.py's quick variant (pure and hybrid Gated DeltaNet), shrunk further."""
  spec = importlib.util.spec_from_file_location("mqar_sweep", os.path.join(ROOT, "configs", "mqar_sweep.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  s = module.get_config("quick")
  s.base.data.update(dict(seq_len=32, global_batch_size=8))
  s.base.data.mqar.num_kv_pairs = 4
  s.base.train.update(dict(steps=3, log_every=3, checkpoint_every=3, warmup_steps=1))
  s.base.eval.update(dict(every=3, steps=1))
  s.mixers["gated_deltanet_3:1"].update(dict(num_layers=2, attn_ratio="1:1"))
  s.widths = [16]
  return s


@pytest.mark.slow
def test_sweep_then_eval_cli(tmp_path, capsys):
  work = str(tmp_path / "sweep")
  cfg = tiny_sweep()
  results = sweep.run_sweep(cfg, work, progress=False)
  assert [r["name"] for r in results] == ["gated_deltanet_w16_lr0.003", "gated_deltanet_3-1_w16_lr0.003"]
  assert all(0 <= r["accuracy"] <= 1 and r["steps"] == 3 for r in results)
  assert results[0]["state_bytes"] == 2 * (2 * 8 * 8 * 4 + 3 * 3 * 16 * 4)  # 2 layers: state + convs
  assert results[1]["kv_cache_bytes"] > 0
  for name in ("results.md", "results.csv", "best.md", "best.json", "accuracy_vs_width.png", "pareto.png"):
    assert os.path.getsize(os.path.join(work, name)) > 0
  # Resumable: finished points are read back, not retrained.
  mtime = os.path.getmtime(os.path.join(work, "points", "gated_deltanet_w16_lr0.003", "result.json"))
  again = sweep.run_sweep(cfg, work, progress=False)
  assert again == results
  assert os.path.getmtime(os.path.join(work, "points", "gated_deltanet_w16_lr0.003", "result.json")) == mtime

  point = os.path.join(work, "points", "gated_deltanet_3-1_w16_lr0.003")
  eval_main(["--workdir", point, "--tasks", "mqar,efficiency", "--mqar_lengths", "32,64",
             "--mqar_kv_pairs", "4", "--mqar_examples", "16", "--efficiency_lengths", "64,4096"])
  printed = capsys.readouterr().out
  assert "MQAR accuracy" in printed and "Efficiency" in printed
  with open(os.path.join(point, "eval", "mqar.json")) as f:
    rows = json.load(f)
  assert [(r["seq_len"], r["num_kv_pairs"]) for r in rows] == [(32, 4), (64, 4)]
  for name in ("mqar.md", "mqar.png", "efficiency.md", "efficiency.csv", "pareto.png"):
    assert os.path.getsize(os.path.join(point, "eval", name)) > 0
  with pytest.raises(SystemExit, match="^error: `--tasks` ppl measures text, and .* MQAR token ids"):
    eval_main(["--workdir", point, "--tasks", "ppl"])


def test_flop_formulas_and_costs():
  # Additive: 4KV + 2C(K+V) per head; delta rule: 6KV + 2C(3K+2V) + C^2/3; attention: 4 L H Dh.
  assert efficiency.linear_flops("gla", 2, 16, 32, chunk=64) == 2 * (4 * 16 * 32 + 2 * 64 * 48)
  assert efficiency.linear_flops("deltanet", 1, 16, 16, chunk=64) == 6 * 256 + 2 * 64 * 80 + 64**2 / 3
  assert efficiency.linear_flops("gated_deltanet", 1, 16, 16, decode=True) == 7 * 256
  assert efficiency.attention_flops(1000, 4, 32) == 4 * 1000 * 4 * 32
  assert efficiency.attention_flops(1000, 4, 32, window=100) == 4 * 100 * 4 * 32
  pure = ModelConfig(vocab_size=64, num_layers=4, hidden=32, heads=2, mixer="gla",
                     mixer_cfg=dict(num_heads=2), backend="xla")
  hybrid = pure.replace(attn_ratio="3:1")
  rows = efficiency.efficiency_rows({"gla": pure, "gla_3:1": hybrid}, context_lens=(1024, 4096))
  by = {(r["model"], r["context_len"]): r for r in rows}
  assert by["gla", 1024]["mixing_MFLOPs_per_token"] == by["gla", 4096]["mixing_MFLOPs_per_token"]
  assert by["gla_3:1", 4096]["mixing_MFLOPs_per_token"] > by["gla_3:1", 1024]["mixing_MFLOPs_per_token"]
  assert by["gla", 4096]["cache_MiB"] == by["gla", 1024]["cache_MiB"]           # constant state
  assert by["gla_3:1", 4096]["cache_MiB"] > by["gla_3:1", 1024]["cache_MiB"]    # KV cache grows
  assert report.pareto_front([(1, 0.5), (2, 0.4), (3, 0.9), (3, 0.7)]) == [(1, 0.5), (3, 0.9)]


def test_sweep_grid_crosses_mixers_ratios_widths_lrs():
  s = tiny_sweep()
  s.ratios, s.widths, s.lrs = ["pure", "1:1"], [16, 32], [1e-3, 3e-3]
  grid = sweep.points(s)
  assert len(grid) == 2 * 2 * 2 * 2
  p = next(g for g in grid if g["name"] == "gated_deltanet_1-1_w32_lr0.001")
  assert p["config"].model.attn_ratio == "1:1" and p["config"].model.hidden == 32
  assert dict(p["config"].model.mixer_cfg) == dict(num_heads=2, head_dim=16, expand_v=1.0, use_short_conv=True)
  assert p["config"].train.lr == 1e-3 and grid[1]["config"].train.lr == 3e-3
  assert s.base.model.hidden == 128 and "attn_ratio" not in s.mixers["gated_deltanet"]   # copies
  assert sweep.best_over_lr([dict(label="a", width=1, accuracy=0.5, lr=1), dict(label="a", width=1,
                                                                             accuracy=0.7, lr=2)])[0]["lr"] == 2


def test_sweep_seeds_cross_the_grid_and_best_lr_is_by_mean_over_seeds():
  s = tiny_sweep()
  s.seeds = [0, 3]
  grid = sweep.points(s)
  assert len(grid) == 2 * 2 and {g["config"].seed for g in grid} == {0, 3}
  assert grid[1]["name"] == "gated_deltanet_w16_lr0.003_s3" and grid[1]["seed"] == 3
  rows = [dict(label="a", width=1, lr=1, accuracy=a) for a in (0.9, 0.1)] + \
         [dict(label="a", width=1, lr=2, accuracy=a) for a in (0.6, 0.6)]     # best single: lr 1
  (best,) = sweep.best_over_lr(rows)
  assert best["lr"] == 2 and best["seeds"] == 2
  assert (best["accuracy"], best["accuracy_min"], best["accuracy_max"]) == (0.6, 0.6, 0.6)


def test_report_writes_atomically(tmp_path):
  path = str(tmp_path / "r.json")
  report.write_json(path, {"a": 1})
  try:
    report.write_atomically(path, lambda f: (f.write("{half"), 1 / 0))
  except ZeroDivisionError:
    pass
  with open(path) as f:
    assert json.load(f) == {"a": 1}       # the failed write left the old file whole


def test_a_signal_ends_the_sweep_not_one_point(tmp_path, monkeypatch):
  from lineax_lm.train import trainer
  started = []

  def interrupted_run(config, workdir):
    started.append(workdir)
    return {"stopped_by": "SIGTERM", "step": 2}

  monkeypatch.setattr(trainer, "train_and_evaluate", interrupted_run)
  with pytest.raises(trainer.Interrupted, match="rerun the same command to resume"):
    sweep.run_sweep(tiny_sweep(), str(tmp_path), progress=False)
  assert len(started) == 1 and not os.path.exists(os.path.join(started[0], "result.json"))


def test_eval_cli_without_checkpoints_says_so_in_one_line(tmp_path):
  with pytest.raises(SystemExit, match=f"^error: no checkpoints under {tmp_path}/checkpoints$"):
    eval_main(["--workdir", str(tmp_path)])
