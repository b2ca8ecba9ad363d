"""Corpus loaders for LM pretraining: parquet files, the held-out split of any text source, packed
gzip corpora and the shipped corpus the small grid reads."""
import json
import os

import numpy as np
import pytest

from lineax_lm.data import ParquetSource, heldout_indices
from lineax_lm.data.pipeline import default_data_config, make_dataset, make_source


def _parquet(path, texts, row_group_size):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path,
                 row_group_size=row_group_size)
  return str(path)


def test_parquet_source_reads_rows_over_files_and_row_groups(tmp_path):
  a = _parquet(tmp_path / "a.parquet", [f"doc {i}" for i in range(5)], 2)
  b = _parquet(tmp_path / "b.parquet", ["last é"], 1)
  src = ParquetSource(f"{a},{b}")
  assert len(src) == 6 and [src[i] for i in (0, 3, 4, 5)] == ["doc 0", "doc 3", "doc 4", "last é"]
  with pytest.raises(IndexError):
    src[6]
  with pytest.raises(ValueError, match="no column .*'body'"):
    ParquetSource(a, text_field="body")
  c = default_data_config()
  c.update(dict(source="parquet", paths=str(tmp_path / "*.parquet"), seq_len=16, global_batch_size=2))
  batch = next(make_dataset(c, seed=0, process_index=0, process_count=1))
  assert batch["inputs"].shape == (2, 16) and batch["inputs"].dtype == np.int32


def test_heldout_split_by_fraction_and_by_files(tmp_path):
  docs = [f"document number {i}" for i in range(200)]
  path = tmp_path / "d.jsonl"
  path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  c = default_data_config()
  c.update(dict(source="jsonl", paths=str(path), heldout_fraction=0.1))
  train, held = make_source(c, 0), None
  c.split = "heldout"
  held = make_source(c, 0)
  train_docs = {train[i] for i in range(len(train))}
  held_docs = [held[i] for i in range(len(held))]
  assert held_docs == [docs[i] for i in heldout_indices(200, 0.1)] and 5 < len(held_docs) < 40
  assert not train_docs & set(held_docs) and len(train_docs) + len(held_docs) == 200
  other = tmp_path / "held.txt"
  other.write_text("a\nb\n")
  c.update(dict(source="text", text_unit="line", paths=str(path), heldout_paths=str(other),
                heldout_fraction=0.0))
  assert [make_source(c, 0)[i] for i in range(2)] == ["a", "b"]
  c.split = "train"
  assert len(make_source(c, 0)) == 200            # separate held-out files: training reads all
  c.update(dict(heldout_paths="", split="heldout"))
  with pytest.raises(ValueError, match="needs held-out data"):
    make_source(c, 0)
  c.split = "dev"
  with pytest.raises(ValueError, match="data.split"):
    make_source(c, 0)


def test_pack_corpus_writes_gzip_shards_the_grid_reads(tmp_path):
  from lineax_lm.experiments import corpus as corpus_lib
  from lineax_lm.experiments.cells import corpus_data
  src = tmp_path / "src"
  src.mkdir()
  docs = [f"joined document {i} é" for i in range(10)]
  (src / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  (src / "heldout.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
  out = str(tmp_path / "packed")
  info = corpus_lib.pack_corpus(out, str(src / "train.jsonl"), str(src / "heldout.jsonl"), shards=3,
                                sampling=dict(join_tokens=2048))
  assert info["documents"] == 10 and info["heldout_documents"] == 1 and info["join_tokens"] == 2048
  shards = corpus_lib.shard_paths(out)
  assert [os.path.basename(p) for p in shards] == [f"train-0000{i}.jsonl.gz" for i in range(3)]
  first = open(shards[0], "rb").read()
  corpus_lib.pack_corpus(out, str(src / "train.jsonl"), str(src / "heldout.jsonl"), shards=2)
  assert len(corpus_lib.shard_paths(out)) == 2            # the third shard of the first pack is gone
  assert corpus_lib.count_documents(corpus_lib.shard_paths(out)) == 10
  corpus_lib.pack_corpus(out, str(src / "train.jsonl"), str(src / "heldout.jsonl"), shards=3)
  assert open(shards[0], "rb").read() == first            # no name or time in the gzip header
  c = default_data_config()
  c.update(corpus_data(out))
  assert [make_source(c, 0)[i] for i in range(10)] == docs
  c.split = "heldout"
  assert [make_source(c, 0)[i] for i in range(1)] == ["held out"]
  open(os.path.join(out, "heldout.jsonl"), "w").write(json.dumps({"text": "x"}) + "\n")
  with pytest.raises(ValueError, match="keep one held-out file"):
    corpus_data(out)
  with pytest.raises(FileNotFoundError, match=r"no train-\*\.jsonl or train-\*\.jsonl\.gz"):
    corpus_data(str(src))


def test_the_small_grid_reads_the_shipped_corpus_and_scores_on_its_heldout_file():
  from lineax_lm.experiments import cells, corpus as corpus_lib
  (cell,) = cells.build_cells("small", "gated_deltanet:3:1@0", accelerator=False)
  folder = corpus_lib.shipped_corpus("smollm2_samples")
  data = cell["config"].data
  assert data.source == "jsonl" and data.paths == os.path.join(folder, "train-*.jsonl.gz")
  assert data.heldout_paths == os.path.join(folder, "heldout.jsonl.gz") and data.heldout_fraction == 0
  train = make_source(data, 0)
  heldout = make_source(cells.heldout_config(cell["config"]), 0)
  assert len(train) == 746 and len(heldout) == 24     # corpora/smollm2_samples/README.md
  train_docs = {train[i] for i in range(len(train))}
  assert not train_docs & {heldout[i] for i in range(len(heldout))}   # never trained on
  assert min(len(d) for d in train_docs) > 2048      # joined samples: >= 2,048 teacher tokens
  with pytest.raises(FileNotFoundError, match="pass --corpus DIR"):
    corpus_lib.shipped_corpus("no_such_corpus")


def test_pack_takes_two_files_and_says_so():
  from lineax_lm.experiments import corpus
  with pytest.raises(SystemExit, match=r"^error: flag --pack=\['train.jsonl'\]: takes two files"):
    corpus.main(["--out", "c", "--pack", "train.jsonl"])
