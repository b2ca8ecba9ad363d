"""data.recall_mix: the share of synthetic rows, their order and content, determinism, resume, the
held-out split without them, and the errors that name the field."""
import json
import re

import numpy as np
import pytest

from lineax_lm.data import recall_mix
from lineax_lm.data.mqar import mqar_example
from lineax_lm.data.pipeline import build_dataset, make_dataset
from lineax_lm.data.recall_mix import KV_TEXT_PHRASINGS, RecallRows, kv_text_document
from lineax_lm.data.tokenizer import ByteTokenizer
from tests.lineax_lm.data.test_pipeline import assert_same, take, text_config


def mixed_config(tmp_path, fraction=0.25, **overrides):
  c, docs = text_config(tmp_path, "jsonl", n_docs=40, seq_len=64, **overrides)
  c.recall_mix.update(dict(fraction=fraction, kinds="mqar,kv_text", mqar_kv_pairs=8))
  return c, docs


def rows_of(batches):
  return [{k: b[k][i] for k in b} for b in batches for i in range(len(b["inputs"]))]


def synthetic_positions(rows, source):
  """Positions of the rows that are the synthetic source's rows 0, 1, 2, ... in that order."""
  found, next_index = [], 0
  for pos, row in enumerate(rows):
    expected = source[next_index]
    if all(np.array_equal(row[k], expected[k]) for k in expected):
      found.append(pos)
      next_index += 1
  return found


def test_a_fraction_of_rows_are_the_synthetic_rows_in_order(tmp_path):
  c, _ = mixed_config(tmp_path)
  rows = rows_of(take(make_dataset(c, seed=3, process_index=0, process_count=1), 6))
  source = RecallRows(kinds="mqar,kv_text", seq_len=64, tokenizer=ByteTokenizer(), seed=3,
                      mqar_kv_pairs=8)
  assert synthetic_positions(rows, source) == list(range(3, 24, 4))  # one row in four, evenly
  mqar_row, kv_row = rows[3], rows[7]
  np.testing.assert_array_equal(mqar_row["inputs"], mqar_example(
      0, seed=3, vocab_size=256, seq_len=64, num_kv_pairs=8, power_a=0.01)["inputs"])
  assert mqar_row["loss_mask"].sum() == 8                       # the queried values only
  weighted = RecallRows(kinds="mqar", seq_len=64, tokenizer=ByteTokenizer(), seed=3, mqar_kv_pairs=8,
                        mqar_loss_weight=8)[0]["loss_mask"]
  np.testing.assert_array_equal(weighted, 8 * mqar_row["loss_mask"])   # weighs as a text row
  assert kv_row["loss_mask"].all() and kv_row["inputs"][0] == ByteTokenizer.bos_id
  for row in (mqar_row, kv_row):                                # one sequence, as packed rows carry
    assert (row["segment_ids"] == 1).all() and (row["positions"] == np.arange(64)).all()
  assert all((r["loss_mask"].sum() == 64) for i, r in enumerate(rows) if i % 4 != 3)


def test_mqar_shapes_pack_several_examples_as_separate_sequences(tmp_path):
  c, _ = mixed_config(tmp_path, fraction=0.5)
  c.recall_mix.update(dict(kinds="mqar", mqar_shapes="16x2,16x4,32x8", mqar_loss_weight=3))
  rows = rows_of(take(make_dataset(c, seed=2, process_index=0, process_count=1), 2))
  source = RecallRows(kinds="mqar", seq_len=64, tokenizer=ByteTokenizer(), seed=2,
                      mqar_shapes="16x2,16x4,32x8", mqar_loss_weight=3)
  assert synthetic_positions(rows, source) == [1, 3, 5, 7]
  row = source[1]
  starts = [0, 16, 32]
  for j, (start, (n, pairs)) in enumerate(zip(starts, ((16, 2), (16, 4), (32, 8)))):
    part = mqar_example(3 + j, seed=2, vocab_size=256, seq_len=n, num_kv_pairs=pairs, power_a=0.01)
    for k in part:                       # example j of row 1: example 1 * 3 + j of the stream
      expected = part[k] * 3 if k == "loss_mask" else part[k]
      np.testing.assert_array_equal(row[k][start:start + n], expected)
    assert (row["segment_ids"][start:start + n] == j + 1).all()
    np.testing.assert_array_equal(row["positions"][start:start + n], np.arange(n))
  assert row["loss_mask"].sum() == 3 * (2 + 4 + 8)


def test_mix_is_deterministic_and_resumes_bit_for_bit(tmp_path):
  c, _ = mixed_config(tmp_path, fraction=0.3, packing="first_fit", num_packing_bins=3)
  it = make_dataset(c, seed=5, process_index=0, process_count=1)
  take(it, 5)
  state = json.loads(json.dumps(it.get_state()))               # what a checkpoint stores
  expected = take(it, 6)
  resumed = make_dataset(c, seed=5, process_index=0, process_count=1)
  resumed.set_state(state)
  assert_same(take(resumed, 6), expected)
  assert_same(take(make_dataset(c, seed=5, process_index=0, process_count=1), 11)[5:], expected)
  other = rows_of(take(make_dataset(c, seed=6, process_index=0, process_count=1), 11)[5:])
  assert any(not np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(other, rows_of(expected)))


def test_processes_get_different_synthetic_rows(tmp_path):
  c, _ = mixed_config(tmp_path, fraction=0.5)
  seen = [{r["inputs"].tobytes() for r in rows_of(take(make_dataset(
      c, seed=0, process_index=i, process_count=2), 4)) if r["loss_mask"].sum() < 64} for i in range(2)]
  assert seen[0] and seen[1] and not seen[0] & seen[1]


def test_heldout_split_reads_text_only(tmp_path):
  c, _ = mixed_config(tmp_path, fraction=0.5, heldout_fraction=0.3, num_epochs=1, shuffle=False,
                      packing="none")
  c.split = "heldout"
  plain = c.copy_and_resolve_references()
  plain.recall_mix.fraction = 0.0
  mixed_rows = list(build_dataset(c, seed=0, process_index=0, process_count=1, drop_remainder=False))
  assert_same(mixed_rows, list(build_dataset(plain, seed=0, process_index=0, process_count=1,
                                             drop_remainder=False)))
  text = b"".join(bytes(int(t) for t in b["inputs"].ravel() if t < 256) for b in mixed_rows)
  assert text.startswith(b"doc") and b" is " not in text and b"->" not in text


def test_kv_text_answers_follow_their_facts_and_avoid_the_ruler_phrasing():
  for index in range(24):
    doc = kv_text_document(seed=1, index=index, num_chars=600)
    assert len(doc) >= 600 and "magic" not in doc and "special" not in doc
    # a document opens with a statement, in the one phrasing it keeps
    statement, question = next(p for p in KV_TEXT_PHRASINGS if re.match(pattern(p[0]), doc))
    facts = {}
    for match in re.finditer(f"{pattern(statement)}|{pattern(question, 'q')}", doc):
      key, value, qkey, qvalue = match.group("key", "value", "qkey", "qvalue")
      if key is not None:
        facts[key] = value
      else:
        assert facts[qkey] == qvalue                            # asked only after it was stated
    assert facts
  assert kv_text_document(1, 3, 600) == kv_text_document(1, 3, 600) != kv_text_document(2, 3, 600)


def pattern(template, prefix=""):
  """A regex of a phrasing: key, value and thing as named groups (prefix `prefix`)."""
  body = re.escape(template).replace(r"\{key\}", f"(?P<{prefix}key>[a-z]+)")
  body = body.replace(r"\{value\}", f"(?P<{prefix}value>[0-9]+)")
  return body.replace(r"\{thing\}", "[a-z ]+?")


@pytest.mark.parametrize("field,value,match", [
    ("fraction", 1.0, r"data\.recall_mix\.fraction"),
    ("fraction", -0.1, r"data\.recall_mix\.fraction"),
    ("fraction", float("nan"), r"data\.recall_mix\.fraction"),
    ("kinds", "needle", r"data\.recall_mix\.kinds"),
    ("kinds", "", r"data\.recall_mix\.kinds"),
    ("mqar_kv_pairs", 17, r"data\.recall_mix\.mqar_kv_pairs"),   # 4 * 17 > seq_len 64
    ("mqar_kv_pairs", 0, r"data\.recall_mix\.mqar_kv_pairs"),
    ("mqar_loss_weight", 0, r"data\.recall_mix\.mqar_loss_weight"),
    ("mqar_shapes", "32x4,16x2", r"mqar_shapes.*sum to data\.seq_len = 64"),
    ("mqar_shapes", "32x4,32x9", r"mqar_shapes.*32x9 is not"),
    ("mqar_shapes", "32-4,32x4", r"mqar_shapes.*LENGTHxPAIRS"),
])
def test_bad_values_name_the_field(tmp_path, field, value, match):
  c, _ = mixed_config(tmp_path)
  c.recall_mix[field] = value
  with pytest.raises(ValueError, match=match):
    make_dataset(c, seed=0, process_index=0, process_count=1)


def test_mqar_shapes_fit_the_models_sequence_bound(tmp_path):
  c, _ = mixed_config(tmp_path, max_segments=8)
  c.recall_mix.mqar_shapes = ",".join(["4x1"] * 16)
  with pytest.raises(ValueError, match=r"mqar_shapes.*16 examples.*max_segments = 8"):
    make_dataset(c, seed=0, process_index=0, process_count=1)
  c.packing, c.recall_mix.mqar_shapes = "none", "32x4,32x8"
  with pytest.raises(ValueError, match=r"mqar_shapes.*'none'"):
    make_dataset(c, seed=0, process_index=0, process_count=1)
  c.split = "heldout"  # the held-out split mixes no rows, but the config is checked all the same
  with pytest.raises(ValueError, match=r"mqar_shapes.*'none'"):
    make_dataset(c, seed=0, process_index=0, process_count=1)


def test_mqar_source_cannot_mix():
  from tests.lineax_lm.data.test_pipeline import mqar_config
  c = mqar_config()
  c.recall_mix.fraction = 0.25
  with pytest.raises(ValueError, match=r"data\.recall_mix\.fraction.*'mqar'"):
    make_dataset(c, seed=0, process_index=0, process_count=1)
  assert recall_mix.parse_kinds(" kv_text , mqar,kv_text") == ("kv_text", "mqar")
