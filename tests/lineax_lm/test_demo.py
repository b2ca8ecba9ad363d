"""The quickstart demo stops at a signal (the interrupted run has saved its step) instead of going on
to the next model; rerunning the command resumes. Its report names the files it wrote, and its
curves plot what each run logged (matplotlib is in the [test] extra)."""
import json
import os

import pytest

from lineax_lm import demo
from lineax_lm.train.metrics import curve, read_rows


def test_sigterm_ends_the_demo_not_one_model(monkeypatch, tmp_path, capsys):
  started = []

  def interrupted_run(config, workdir):
    started.append(workdir)
    return {"stopped_by": "SIGTERM", "step": 3, "num_params": 1}

  monkeypatch.setattr(demo, "train_and_evaluate", interrupted_run)
  with pytest.raises(SystemExit) as exit_info:
    demo.main(["--workdir", str(tmp_path), "--variants", "gdn,linear"])
  assert exit_info.value.code == 143  # 128 + SIGTERM, as a shell reports a terminated command
  assert len(started) == 1
  assert "rerun the same command to resume" in capsys.readouterr().out


def test_the_closing_line_names_only_the_files_written(monkeypatch, tmp_path, capsys):
  monkeypatch.setattr(demo, "train_and_evaluate", lambda config, workdir: {"num_params": 1, "eval_accuracy": 0.5})
  monkeypatch.setattr(demo, "available", lambda name: False)  # no matplotlib: no recall.png
  demo.main(["--workdir", str(tmp_path), "--variants", "gdn"])
  last = capsys.readouterr().out.strip().splitlines()[-1]
  assert f"{tmp_path}/results.md;" in last and "recall.png" not in last


def test_curves_plot_the_loss_and_recall_the_runs_logged(monkeypatch, tmp_path, capsys):
  def logged_run(config, workdir):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      for step, loss, recall in ((50, 3.4, None), (100, 1.2, 0.6), (150, 0.3, None), (200, 0.1, 0.95)):
        f.write(json.dumps({"step": step, "loss": loss}) + "\n")
        if recall is not None:
          f.write(json.dumps({"step": step, "eval_loss": loss, "eval_accuracy": recall}) + "\n")
    return {"num_params": 1, "eval_accuracy": 0.95}

  monkeypatch.setattr(demo, "train_and_evaluate", logged_run)
  demo.main(["--workdir", str(tmp_path), "--variants", "gdn,transformer"])
  metrics = read_rows(str(tmp_path / "transformer" / "metrics.jsonl"))
  assert curve(metrics, "loss") == ([50, 100, 150, 200], [3.4, 1.2, 0.3, 0.1])
  assert curve(metrics, "eval_accuracy") == ([100, 200], [0.6, 0.95])
  with open(tmp_path / "transformer" / "metrics.jsonl", "a") as f:
    f.write('{"step": 250, "lo')  # a row the trainer is still writing (the notebook's live plot)
  assert read_rows(str(tmp_path / "transformer" / "metrics.jsonl")) == metrics
  assert read_rows(str(tmp_path / "absent.jsonl")) == []
  assert (tmp_path / "curves.png").stat().st_size > 0
  assert f"{tmp_path}/curves.png;" in capsys.readouterr().out.strip().splitlines()[-1]
