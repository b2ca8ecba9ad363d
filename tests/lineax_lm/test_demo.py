"""The quickstart demo stops at a signal (the interrupted run has saved its step) instead of going on
to the next model; rerunning the command resumes."""
import pytest

from lineax_lm import demo


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
