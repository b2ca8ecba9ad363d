"""The scoring primitives on a tiny HybridLM: pair log-likelihoods equal the log-softmax of a plain
forward pass, rolling windows cover every token once, teacher-forced greedy match agrees with
generate(), and the lm_eval adapter answers a tiny fake task (requests as objects with `.args`)."""
import os
import types

import jax
import numpy as np
import pytest
from flax import nnx

from lineax_lm.data.tokenizer import ByteTokenizer
from lineax_lm.eval import language, ruler, scoring
from lineax_lm.eval.lm_eval_adapter import LineaxLM
from lineax_lm.models.hybrid import HybridLM
from tests.lineax_lm.tiny import tiny_config

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def model():
  return HybridLM(tiny_config("gated_deltanet", vocab_size=TOK.vocab_size, num_layers=2,
                              attn_ratio="1:1"), nnx.Rngs(0))


@nnx.jit
def _forward(model, x):
  return jax.nn.log_softmax(model(x), -1)


def log_probs(model, seq):
  """log p(seq[t+1] | seq[:t+1]) and greedy flags from a plain forward pass (padded to 64: causal)."""
  x = np.zeros((1, 64), np.int32)
  x[0, :len(seq) - 1] = seq[:-1]
  logp = np.asarray(_forward(model, x))[0, :len(seq) - 1]
  return logp[np.arange(len(seq) - 1), seq[1:]], logp.argmax(-1) == np.asarray(seq[1:])


def test_score_pairs_matches_a_plain_forward_pass(model):
  scorer = scoring.Scorer(model, batch_size=4)
  rng = np.random.default_rng(0)
  pairs = [(rng.integers(0, 256, n).tolist(), rng.integers(0, 256, m).tolist())
           for n, m in ((5, 3), (20, 1), (9, 7))]
  got = scoring.score_pairs(scorer, pairs)
  for (ctx, cont), (ll, greedy) in zip(pairs, got):
    lp, g = log_probs(model, ctx + cont)
    assert ll == pytest.approx(float(lp[-len(cont):].sum()), rel=1e-4, abs=1e-4)
    assert greedy == bool(g[-len(cont):].all())
  with pytest.raises(ValueError, match="at least one|>= 1 token"):
    scoring.score_pairs(scorer, [([], [1])])


def test_min_length_scores_every_length_with_one_shape(model):
  """A scorer with min_length pads every batch to that length (one compiled program for the
  study's needles, recall and throughput) and gives the scores of the plain bucketed scorer."""
  rng = np.random.default_rng(1)
  pairs = [(rng.integers(0, 256, n).tolist(), rng.integers(0, 256, 3).tolist()) for n in (5, 20, 40)]
  padded = scoring.Scorer(model, batch_size=4, min_length=64)
  shapes, jitted = [], padded._scores
  padded._scores = lambda state, x, t: (shapes.append(x.shape), jitted(state, x, t))[1]
  got = scoring.score_pairs(padded, pairs)
  assert set(shapes) == {(4, 64)}
  for (ll, greedy), (ll0, greedy0) in zip(got, scoring.score_pairs(scoring.Scorer(model, 4), pairs)):
    assert ll == pytest.approx(ll0, rel=1e-5, abs=1e-5) and greedy == greedy0
  with pytest.raises(ValueError, match="min_length"):
    scoring.Scorer(model, min_length=0)


def test_rolling_windows_predict_every_token_once(model):
  ids = list(range(1, 40))
  for max_len in (7, 16, 64):
    pairs = scoring.rolling_windows(ids, 256, max_len)
    assert [t for _, cont in pairs for t in cont] == ids
    assert all(len(ctx) + len(cont) <= max_len + 1 for ctx, cont in pairs)
  scorer = scoring.Scorer(model, batch_size=4)
  full = scoring.loglikelihood_rolling(scorer, ids, 256, 64)    # one window: the whole text
  lp, _ = log_probs(model, [256] + ids)
  assert full == pytest.approx(float(lp.sum()), rel=1e-4)
  res = language.perplexity(scorer, TOK, ["hello world", "abc"], max_len=8)
  assert res["tokens"] == 14 and res["bytes"] == 14
  assert res["bits_per_byte"] == pytest.approx(res["nll"] / 14 / np.log(2))


def test_bits_per_byte_count_utf8_bytes_not_characters(model):
  """Non-ASCII text: 2- and 3-byte characters. With the byte tokenizer every UTF-8 byte is a
  token, so bits per byte equal bits per token, and the bytes outnumber the characters."""
  docs = ["héllo wörld", "日本語のテキスト", "naïve"]
  res = language.perplexity(scoring.Scorer(model, batch_size=4), TOK, docs, max_len=64)
  nbytes = sum(len(d.encode("utf-8")) for d in docs)
  assert res["bytes"] == nbytes == 13 + 24 + 6 and nbytes > sum(map(len, docs))
  nll = -sum(float(log_probs(model, [TOK.bos_id] + TOK.encode(d))[0].sum()) for d in docs)
  assert res["nll"] == pytest.approx(nll, rel=1e-4)
  assert res["bits_per_byte"] == pytest.approx(nll / nbytes / np.log(2), rel=1e-4)
  assert res["bits_per_byte"] == pytest.approx(res["bits_per_token"], rel=1e-6)


def test_teacher_forced_greedy_match_agrees_with_generate(model, capsys):
  scorer = scoring.Scorer(model, batch_size=4)
  prompts = np.random.default_rng(1).integers(0, 256, (3, 24)).astype(np.int32)
  gen = scoring.greedy_generate(model, prompts, 4)
  right = scoring.score_pairs(scorer, [(p.tolist(), g.tolist()) for p, g in zip(prompts, gen)])
  assert all(g for _, g in right)
  wrong = scoring.score_pairs(scorer, [(p.tolist(), ((g + 1) % 256).tolist()) for p, g in zip(prompts, gen)])
  assert not any(g for _, g in wrong)
  rows = ruler.evaluate_tasks(model, TOK, "niah_single", lengths=(512,), num_examples=2, mode="generate",
                              progress=True)
  assert "2/2" in capsys.readouterr().err   # the bar counted both examples
  rows += ruler.evaluate_tasks(scorer, TOK, "niah_single", lengths=(512,), num_examples=2,
                               mode="teacher_forced")
  assert [r["mode"] for r in rows] == ["generate", "teacher_forced"]
  assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows) and rows[1]["answer_logprob"] < 0


def req(*args):
  return types.SimpleNamespace(args=args)


def test_lm_eval_adapter_answers_a_tiny_fake_task(model):
  lm = LineaxLM(model=model, tokenizer="byte", max_length=32, batch_size=4, max_gen_toks=4)
  # A two-choice task: the choice the model scores higher is its answer; both are proper logprobs.
  choices = lm.loglikelihood([req("The cat sat on the", " mat"), req("The cat sat on the", " hat"),
                              req("", "abc")])
  assert len(choices) == 3 and all(ll < 0 and isinstance(g, bool) for ll, g in choices)
  ctx, cont = lm._encode_pair("Question: 2+2= ", "4")
  assert TOK.decode(ctx) == "Question: 2+2=" and TOK.decode(cont) == " 4"
  direct = scoring.score_pairs(lm.scorer, [lm._encode_pair("The cat sat on the", " mat")])[0]
  assert choices[0][0] == pytest.approx(direct[0])
  text = "a rolling text longer than the window " * 2
  (ll,) = lm.loglikelihood_rolling([req(text)])
  ids = TOK.encode(text)
  ref = sum(l for l, _ in scoring.score_pairs(lm.scorer, scoring.rolling_windows(ids, 256, 32), 32))
  assert ll == pytest.approx(ref) and ll < 0
  outs = lm.generate_until([req("Once upon", {"until": ["o"], "max_gen_toks": 4}),
                            req("Once upon", {"until": "zz"}),
                            req("Once upon a time", {"until": "zz"})])  # another length, one batch
  assert len(outs) == 3 and all(isinstance(o, str) for o in outs)
  assert outs[1].startswith(outs[0]) and "o" not in outs[0]      # one greedy text, cut at its stops
  lm2 = LineaxLM.create_from_arg_string("max_length=16,max_gen_toks=2", {"model": model, "tokenizer": "byte",
                                                                         "batch_size": 1, "device": None})
  assert lm2.max_length == 16 and lm2.max_gen_toks == 2 and lm2.batch_size == 1
  with pytest.raises(ValueError, match="workdir"):
    LineaxLM()


def test_pyproject_entry_point_names_the_adapter_class():
  import importlib
  import tomllib
  with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "pyproject.toml"), "rb") as f:
    eps = tomllib.load(f)["project"]["entry-points"]["lm_eval.models"]
  module, _, attr = eps["lineax"].partition(":")
  assert getattr(importlib.import_module(module), attr) is LineaxLM
