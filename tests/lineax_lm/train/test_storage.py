"""Workdirs and data on gs:// (a fake GCS on local disk, tests/lineax_lm/fake_gcs.py): a run trains,
checkpoints, stops and resumes there, its metrics.jsonl and TensorBoard events land in the bucket,
nothing appears under the working directory, and the trained model loads and saves there."""
import json
import os

import numpy as np
import pytest

import lineax_lm
from lineax_lm import storage
from lineax_lm.train.trainer import train_and_evaluate
from tests.lineax_lm.fake_gcs import fake_gcs
from tests.lineax_lm.train.test_trainer import tiny_config


def test_storage_paths():
  assert os.fspath(storage.as_path("gs://b/runs/x")) == "gs://b/runs/x"
  assert storage.join("gs://b/runs", "x", "metrics.jsonl") == "gs://b/runs/x/metrics.jsonl"
  assert os.fspath(storage.as_path("runs/x")) == os.path.abspath("runs/x")
  assert storage.is_remote("gs://b") and storage.is_local("/tmp/x")


@pytest.mark.slow
def test_train_checkpoint_resume_and_load_on_gcs(tmp_path, monkeypatch):
  bucket = fake_gcs(tmp_path / "gcs", monkeypatch)
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  data = tmp_path / "gcs" / "b" / "data"
  data.mkdir(parents=True)
  (data / "a.txt").write_text("the cat sat on the mat\n" * 20)
  (data / "b.txt").write_text("a dog ran in the park\n" * 20)
  config = tiny_config(steps=2, vocab_size=259, num_layers=1, attn_ratio="pure")  # one block kind
  config.data.update(dict(source="text", paths="gs://b/data/*.txt", text_unit="line", seq_len=16,
                          global_batch_size=8, max_segments=4))
  # 16-token rows of ~24-token lines hold at most 3 sequences; the default bound of 16 would lay
  # each row out as 16 chunks of 64 (the varlen path's static bound) and cost 16x the compute.
  config.model.max_segments = 4
  config.eval.steps = 0
  workdir = "gs://b/runs/x"
  assert train_and_evaluate(config, workdir)["step"] == 2
  config.train.steps = 4          # the same workdir: resumes from step 2
  assert train_and_evaluate(config, workdir)["step"] == 4
  run = tmp_path / "gcs" / "b" / "runs" / "x"
  assert sorted(os.listdir(run / "checkpoints")) == ["2", "3", "4"]  # checkpoint_every=3
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  assert [f for f in os.listdir(run / "tensorboard") if "tfevents" in f]
  assert os.listdir(cwd) == []    # no ./gs:/... folder: no local-path assumption on the way
  loaded = lineax_lm.load(workdir)  # parameters only, from the bucket
  assert loaded.step == 4 and loaded.tokenizer is not None
  lineax_lm.save_pretrained(loaded.model, "gs://b/export", tokenizer=loaded.tokenizer)
  again = lineax_lm.load("gs://b/export")
  np.testing.assert_array_equal(np.asarray(again.model.embed.embedding[...]),
                                np.asarray(loaded.model.embed.embedding[...]))
  assert bucket("gs://b/export") == os.fspath(tmp_path / "gcs" / "b" / "export")
