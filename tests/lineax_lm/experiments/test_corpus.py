"""Corpus loaders for LM pretraining: parquet files, and the held-out split of any text source."""
import json

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
