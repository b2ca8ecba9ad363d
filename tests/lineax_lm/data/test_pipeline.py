"""make_dataset: shapes, determinism, iterator state save/restore, disjoint per-process shards."""
import json

import numpy as np
import pytest

from lineax_lm.data.pipeline import build_dataset, data_vocab_size, default_data_config, make_dataset
from lineax_lm.data.tokenizer import ByteTokenizer

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def mqar_config(**overrides):
  c = default_data_config()
  c.seq_len, c.global_batch_size = 32, 8
  c.mqar.vocab_size, c.mqar.num_kv_pairs, c.mqar.num_examples = 64, 4, 64
  c.update(overrides)
  return c


def text_config(tmp_path, source="jsonl", n_docs=48, **overrides):
  rng = np.random.default_rng(0)
  docs = [f"doc{i} " + " ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for i in range(n_docs)]
  if source == "jsonl":
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    paths = str(tmp_path / "docs.jsonl")
  else:
    (tmp_path / "docs.txt").write_text("\n".join(docs) + "\n")
    paths = str(tmp_path / "docs.txt")
  c = default_data_config()
  c.update(dict(source=source, paths=paths, text_unit="line", seq_len=24, global_batch_size=4))
  c.update(overrides)
  return c, docs


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_mqar_batches():
  it = make_dataset(mqar_config(), seed=0, process_index=1, process_count=2)
  batch = next(it)
  assert set(batch) == {"inputs", "targets", "loss_mask"}
  for x in batch.values():
    assert x.shape == (4, 32) and x.dtype == np.int32
  assert batch["loss_mask"].sum() == 4 * 4
  assert data_vocab_size(mqar_config()) == 64
  assert_same(take(make_dataset(mqar_config(), seed=0, process_index=1, process_count=2), 3),
              [batch] + take(it, 2))
  other = next(make_dataset(mqar_config(), seed=1, process_index=1, process_count=2))
  assert not np.array_equal(other["inputs"], batch["inputs"])


@pytest.mark.parametrize("source,packing", [("mqar", None), ("jsonl", "first_fit"),
                                            ("text", "concat"), ("jsonl", "none")])
def test_state_restore_gives_identical_batches(tmp_path, source, packing):
  if source == "mqar":
    c = mqar_config()
  else:
    c, _ = text_config(tmp_path, source, n_docs=12, packing=packing, num_packing_bins=3)
  it = make_dataset(c, seed=5, process_index=0, process_count=1)
  take(it, 7)  # crosses epoch ends (num_epochs None: repeats, reshuffled)
  state = json.loads(json.dumps(it.get_state()))  # what a checkpoint stores
  expected = take(it, 9)
  resumed = make_dataset(c, seed=5, process_index=0, process_count=1)
  resumed.set_state(state)
  assert_same(take(resumed, 9), expected)
  fresh = take(make_dataset(c, seed=5, process_index=0, process_count=1), 16)
  assert_same(fresh[7:], expected)  # deterministic from the seed alone
  if source != "mqar":
    assert {"segment_ids", "positions"} <= set(expected[0]) or packing == "none"
    for batch in expected:
      assert batch["inputs"].shape == (4, 24) and batch["inputs"].max() < ByteTokenizer.vocab_size


def docs_seen(config, docs, process_index, process_count):
  """The documents one process reads in one epoch (packing 'none': a row starts with its doc)."""
  tok = ByteTokenizer()
  ds = build_dataset(config, seed=3, process_index=process_index, process_count=process_count,
                     batch_size=6, drop_remainder=False)
  seen = []
  for batch in ds:
    for row in batch["inputs"]:
      text = tok.decode(row)
      seen.append(next(d for d in docs if d.startswith(text.split(" ")[0] + " ")))
  return seen


def test_process_shards_are_disjoint(tmp_path):
  c, docs = text_config(tmp_path, "jsonl", n_docs=50, packing="none", num_epochs=1, seq_len=96)
  shards = [docs_seen(c, docs, i, 3) for i in range(3)]
  assert all(len(s) == 16 for s in shards)  # an equal split: 50 // 3 each, the remainder dropped
  sets = [set(s) for s in shards]
  assert all(len(s) == 16 for s in sets)
  assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
  assert sets[0] | sets[1] | sets[2] <= set(docs)
  m = mqar_config(num_epochs=1, shuffle=False)
  rows = [np.concatenate([b["inputs"] for b in build_dataset(m, seed=0, process_index=i,
                                                             process_count=2)]) for i in range(2)]
  together = {r.tobytes() for r in np.concatenate(rows)}
  assert len(together) == 64  # every example once, over both processes


def test_config_errors(tmp_path):
  with pytest.raises(ValueError, match="source"):
    make_dataset(mqar_config(source="csv"), seed=0, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="process_count"):
    make_dataset(mqar_config(), seed=0, process_index=0, process_count=3)
  with pytest.raises(ValueError, match="process_index"):
    make_dataset(mqar_config(), seed=0, process_index=2, process_count=2)
  c, _ = text_config(tmp_path, packing="best")
  with pytest.raises(ValueError, match="packing"):
    make_dataset(c, seed=0, process_index=0, process_count=1)
  c, _ = text_config(tmp_path, tokenizer=str(tmp_path / "missing"))
  with pytest.raises(FileNotFoundError, match="tokenizer"):
    make_dataset(c, seed=0, process_index=0, process_count=1)
  c, _ = text_config(tmp_path, source="tfds", tfds_name="mnist", tfds_data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match="tfds build"):
    make_dataset(c, seed=0, process_index=0, process_count=1)
  with pytest.raises(AttributeError):
    c = default_data_config()
    c.lock()
    c.seqlen = 3  # a typo in a locked config fails
