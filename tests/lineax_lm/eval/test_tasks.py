"""Recall task generators: exact lengths, determinism per seed, labels checked by the brute-force
solvers, RULER scoring; MQAR scored by the hand-set attention oracle through the model scoring code."""
import numpy as np
import pytest

from lineax_lm.data.tokenizer import ByteTokenizer
from lineax_lm.eval import mqar, recall, ruler, scoring

TOK = ByteTokenizer()
LENGTHS = {**{t: 1024 for t in recall.NIAH_TASKS}, "vt": 1024, "cwe": 2048, "fwe": 1024}


@pytest.mark.parametrize("task", sorted(ruler.TASKS))
def test_generator_exact_length_deterministic_and_solvable(task):
  L = LENGTHS[task]
  a = ruler.make_examples(task, TOK, L, 4, seed=3)
  b = ruler.make_examples(task, TOK, L, 4, seed=3)
  c = ruler.make_examples(task, TOK, L, 4, seed=4)
  for x, y in zip(a, b):
    assert x.prompt == y.prompt and x.answers == y.answers
    np.testing.assert_array_equal(x.prompt_ids, y.prompt_ids)
  assert [x.prompt for x in a] != [x.prompt for x in c]
  assert len({x.prompt for x in a}) == 4                      # examples differ from each other
  for ex in a:
    assert ex.prompt_ids.shape == (L,) and ex.prompt_ids.dtype == np.int32
    assert TOK.decode(ex.prompt_ids.tolist()) == ex.prompt
    assert ruler.solve(ex) == list(ex.answers)                 # brute force from the text alone
    assert TOK.decode(ex.answer_ids.tolist()) == ex.answer_text
    assert all(ans in ex.answer_text for ans in ex.answers)
  assert ruler.score_predictions(a, [x.answer_text for x in a]) == 1.0
  assert ruler.score_predictions(a, [" ".join(ruler.solve(x)) for x in a]) == 1.0
  assert ruler.score_predictions(a, ["nothing"] * 4) == 0.0


def test_needles_at_varied_depths_and_corpus_haystack():
  corpus = ["Alpha beta gamma. Delta epsilon zeta! Eta theta iota?\nKappa lambda mu."]
  exs = ruler.make_examples("niah_single", TOK, 2048, 8, seed=0, corpus=corpus)
  depths = [ex.prompt.index("One of the special magic") / len(ex.prompt) for ex in exs]
  assert max(depths) - min(depths) > 0.3
  assert all("Kappa lambda mu." in ex.prompt and "grass" not in ex.prompt for ex in exs)
  assert all(ruler.solve(ex) == list(ex.answers) for ex in exs)


def test_multi_needle_variants_ask_the_right_values():
  (mk,) = ruler.make_examples("niah_multikey", TOK, 1024, 1, seed=1)
  assert mk.prompt.count("One of the special magic") == 4 and len(mk.answers) == 1
  (mv,) = ruler.make_examples("niah_multivalue", TOK, 1024, 1, seed=1)
  assert len(mv.answers) == 4 and len(set(recall._NEEDLE_RE.findall(mv.prompt))) == 4
  (mq,) = ruler.make_examples("niah_multiquery", TOK, 1024, 1, seed=1)
  assert len(mq.answers) == 4
  (u,) = ruler.make_examples("niah_multikey_uuid", TOK, 1024, 1, seed=1)
  assert len(u.answers[0]) == 36 and u.answers[0].count("-") == 4


def test_too_short_lengths_are_reported_not_crashed():
  with pytest.raises(recall.TooShort, match="longer length"):
    ruler.make_examples("vt", TOK, 256, 1)
  rows = ruler.evaluate_tasks(None, TOK, "vt", lengths=(256,), num_examples=1, mode="teacher_forced")
  assert rows[0]["accuracy"] is None
  with pytest.raises(ValueError, match="unknown recall task"):
    ruler.resolve_tasks("needle,nope")
  assert ruler.resolve_tasks("needle,vt") == list(recall.NIAH_TASKS) + ["vt"]


def test_teacher_forced_scoring_gives_the_separator():
  """The space before the answer joins the context, so "are: 4033451" is not a recall miss."""
  ex = ruler.make_examples("niah_single", TOK, 512, 1, seed=0)[0]
  ctx, cont = ruler.forced_pair(TOK, ex)
  assert TOK.decode(ctx[len(ex.prompt_ids):]) == " " and TOK.decode(cont) == ex.answers[0]
  assert ctx[:len(ex.prompt_ids)] == ex.prompt_ids.tolist()
  blank = recall.make_example("x", TOK, 1, ex.prompt_ids[:1], "", ("",), "  ")
  assert len(ruler.forced_pair(TOK, blank)[1]) == 1                # something is always scored


def test_string_match_and_stop():
  assert scoring.string_match_all("The values are 12, 34.", ["12", "34", "56"]) == pytest.approx(2 / 3)
  assert scoring.cut_at_stop("abc\ndef", ["\n"]) == "abc"
  assert scoring.bucket(1) == 16 and scoring.bucket(100) == 128 and scoring.bucket(128) == 128


def test_mqar_oracle_scores_100_percent_through_the_scoring_code():
  oracle = mqar.induction_head_oracle(128)
  rows = mqar.mqar_grid(oracle, vocab_size=128, seq_lens=(64, 128), kv_pairs=(4, 16, 32),
                        num_examples=48, batch_size=16)
  assert [(r["seq_len"], r["num_kv_pairs"]) for r in rows] == [(64, 4), (64, 16), (128, 4), (128, 16),
                                                               (128, 32)]
  assert all(r["accuracy"] == 1.0 for r in rows)
  assert "seq_len" in mqar.format_grid(rows)
  # The scoring is not vacuous: an oracle that copies the wrong token scores ~0.
  shifted = lambda t: oracle(t)[..., ::-1]
  assert mqar.mqar_accuracy(shifted, vocab_size=128, seq_len=64, num_kv_pairs=8, num_examples=16) < 0.1


def test_heldout_split_is_deterministic_and_reads_the_data_stack(tmp_path):
  from lineax_lm.data.pipeline import default_data_config
  from lineax_lm.eval import language
  idx = language.heldout_indices(1000, 0.1)
  assert 60 < len(idx) < 140 and idx == language.heldout_indices(1000, 0.1)
  assert language.heldout_indices(500, 0.1) == [i for i in idx if i < 500]   # prefix-stable
  path = tmp_path / "held.txt"
  path.write_text("first doc\n\nsecond doc\nthird\n")
  cfg = default_data_config()
  cfg.update(dict(source="text", paths=str(path), text_unit="line"))
  assert language.heldout_documents(cfg) == ["first doc", "second doc", "third"]
  cfg.source = "mqar"
  with pytest.raises(ValueError, match="text source"):
    language.heldout_documents(cfg)
