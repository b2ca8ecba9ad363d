"""MQAR: labels checked by a brute-force solver, determinism per (seed, index), argument errors."""
import numpy as np
import pytest

from lineax_lm.data.mqar import MQARSource, gap_probabilities


def brute_force_answers(inputs: np.ndarray, num_kv_pairs: int) -> dict[int, int]:
  """Reads the example as a person would: the first 2n tokens are (key, value) pairs; every later
  position holding one of those keys (at an even offset of the query region) is a query whose answer
  is the value stored with that key. Returns {position: answer}."""
  n = num_kv_pairs
  store = {}
  for i in range(n):
    store[int(inputs[2 * i])] = int(inputs[2 * i + 1])
  answers = {}
  for pos in range(2 * n, len(inputs)):
    if int(inputs[pos]) in store and (pos - 2 * n) % 2 == 0:
      answers[pos] = store[int(inputs[pos])]
  return answers


@pytest.mark.parametrize("vocab_size,seq_len,n,power_a", [(64, 32, 4, 0.01), (1000, 128, 16, 0.5),
                                                          (40, 81, 19, 1.0)])
def test_labels_match_brute_force_solver(vocab_size, seq_len, n, power_a):
  src = MQARSource(vocab_size=vocab_size, seq_len=seq_len, num_kv_pairs=n, power_a=power_a,
                   num_examples=50, seed=3, random_non_queries=False)
  for i in range(len(src)):
    ex = src[i]
    assert set(ex) == {"inputs", "targets", "loss_mask"}
    for x in ex.values():
      assert x.shape == (seq_len,) and x.dtype == np.int32
    inp, tgt, mask = ex["inputs"], ex["targets"], ex["loss_mask"]
    keys, values = inp[0:2 * n:2], inp[1:2 * n:2]
    assert len(set(keys.tolist())) == n and len(set(values.tolist())) == n
    assert keys.min() >= 1 and keys.max() < vocab_size // 2
    assert values.min() >= vocab_size // 2 and values.max() < vocab_size
    answers = brute_force_answers(inp, n)
    assert len(answers) == n  # each key queried exactly once
    assert sorted(np.flatnonzero(mask).tolist()) == sorted(answers)
    for pos, value in answers.items():
      assert tgt[pos] == value
    assert np.all(tgt[mask == 0] == 0)


def test_random_fill_keeps_labels():
  """With random filler tokens a filler may equal a key, so the labels are checked from the query
  positions the mask names: the key there and the answer agree with the pairs."""
  src = MQARSource(vocab_size=128, seq_len=64, num_kv_pairs=8, num_examples=20, seed=1)
  for i in range(len(src)):
    ex = src[i]
    n = 8
    store = dict(zip(ex["inputs"][0:2 * n:2].tolist(), ex["inputs"][1:2 * n:2].tolist()))
    pos = np.flatnonzero(ex["loss_mask"])
    assert len(pos) == n and np.all(pos >= 2 * n) and np.all((pos - 2 * n) % 2 == 0)
    assert sorted(ex["inputs"][pos].tolist()) == sorted(store)
    assert [store[k] for k in ex["inputs"][pos].tolist()] == ex["targets"][pos].tolist()
    fill = np.ones(64, bool)
    fill[:2 * n] = False
    fill[pos] = False
    assert ex["inputs"][fill].max() < 128 and len(set(ex["inputs"][fill].tolist())) > 1


def test_deterministic_per_seed_and_index():
  a = MQARSource(vocab_size=256, seq_len=64, num_kv_pairs=8, seed=7)
  b = MQARSource(vocab_size=256, seq_len=64, num_kv_pairs=8, seed=7)
  c = MQARSource(vocab_size=256, seq_len=64, num_kv_pairs=8, seed=8)
  for i in (0, 5, 99_999):
    for k in ("inputs", "targets", "loss_mask"):
      np.testing.assert_array_equal(a[i][k], b[i][k])
  assert not np.array_equal(a[0]["inputs"], c[0]["inputs"])
  assert not np.array_equal(a[0]["inputs"], a[1]["inputs"])
  batch = a.batch([3, 5])
  assert batch["inputs"].shape == (2, 64)
  np.testing.assert_array_equal(batch["targets"][1], a[5]["targets"])


def test_power_law_gaps():
  p = gap_probabilities(10, 0.5)
  assert np.isclose(p.sum(), 1.0) and np.all(np.diff(p) < 0)
  src = MQARSource(vocab_size=512, seq_len=512, num_kv_pairs=4, power_a=0.01, num_examples=200)
  gaps = np.concatenate([(np.flatnonzero(src[i]["loss_mask"]) - 8) // 2 for i in range(200)])
  assert np.median(gaps) < 252 / 4  # short gaps dominate (uniform would give ~126)


@pytest.mark.parametrize("kwargs,field", [
    (dict(vocab_size=16, num_kv_pairs=8), "vocab_size"),
    (dict(seq_len=30, num_kv_pairs=8), "seq_len"),
    (dict(power_a=0.0), "power_a"),
    (dict(num_kv_pairs=0), "num_kv_pairs"),
    (dict(seq_len=64.0), "seq_len"),
])
def test_bad_arguments(kwargs, field):
  with pytest.raises(ValueError, match=field):
    MQARSource(**kwargs)
  with pytest.raises(IndexError):
    MQARSource(num_examples=3)[3]
