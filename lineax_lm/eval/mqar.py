"""MQAR evaluation: teacher-forced accuracy on the value positions of held-out MQAR examples (the
Zoology metric), over a grid of sequence lengths and key-value counts, plus an oracle.

Examples come from `lineax_lm.data.mqar.MQARSource` (the training generator) with a test seed, so a
model trained on seed s is scored on examples it never saw. Accuracy = correct argmax predictions /
number of query positions (loss_mask 1), pooled over all examples of a grid point.

The oracle is one attention head with hand-set weights (an induction head): the query of position
i is the one-hot of token x_i, the key of position j is the one-hot of the token before it, x_{j-1},
and the value is the one-hot of x_j. Scores (2 L + 50) * [x_i == x_{j-1}] - j (causal, j <= i)
make the head attend to the first place where x_i was seen followed by a token, and copy that token:
the value paired with the queried key (keys appear in the pair region before any filler). It scores
100% through the same scoring code as the models, which checks the scoring and the labels.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp

from lineax_lm.data.mqar import MQARSource
from lineax_lm.eval.scoring import as_scorer, masked_accuracy

TEST_SEED = 1_000_003  # training uses config.seed (0, ...), the trainer's eval config.eval.seed


def mqar_accuracy(model, *, vocab_size: int, seq_len: int, num_kv_pairs: int, num_examples: int = 256,
                  seed: int = TEST_SEED, power_a: float = 0.01, random_non_queries: bool = True,
                  batch_size: int = 32) -> float:
  """Accuracy of `model` (HybridLM, Scorer or callable tokens -> logits) on `num_examples` MQAR
  examples of the given shape drawn from `seed`."""
  if num_examples < 1:
    raise ValueError(f"`num_examples` must be >= 1; got {num_examples}")
  src = MQARSource(vocab_size=vocab_size, seq_len=seq_len, num_kv_pairs=num_kv_pairs, power_a=power_a,
                   num_examples=num_examples, seed=seed, random_non_queries=random_non_queries)
  scorer = as_scorer(model, batch_size)
  correct = count = 0.0
  for s in range(0, num_examples, scorer.batch_size):
    c, n = masked_accuracy(scorer, src.batch(range(s, min(s + scorer.batch_size, num_examples))))
    correct, count = correct + c, count + n
  return correct / count


def mqar_grid(model, *, vocab_size: int, seq_lens: Iterable[int], kv_pairs: Iterable[int],
              num_examples: int = 256, seed: int = TEST_SEED, batch_size: int = 32,
              **kw) -> list[dict]:
  """Accuracy rows {"seq_len", "num_kv_pairs", "accuracy", "num_examples"} for every (length, kv
  count) with 4 * kv <= length (the others cannot hold the pairs and their queries)."""
  seq_lens, kv_pairs = list(seq_lens), list(kv_pairs)
  for name, values in (("seq_lens", seq_lens), ("kv_pairs", kv_pairs)):
    if not values or min(values) < 1:
      raise ValueError(f"`{name}` must be one or more integers >= 1; got {values}")
  if num_examples < 1:
    raise ValueError(f"`num_examples` must be >= 1; got {num_examples}")
  scorer = as_scorer(model, batch_size)
  rows = []
  for L in seq_lens:
    for n in kv_pairs:
      if 4 * n > L or vocab_size // 2 - 1 < n:
        continue
      acc = mqar_accuracy(scorer, vocab_size=vocab_size, seq_len=L, num_kv_pairs=n,
                          num_examples=num_examples, seed=seed, **kw)
      rows.append(dict(seq_len=L, num_kv_pairs=n, accuracy=acc, num_examples=num_examples))
  return rows


def induction_head_oracle(vocab_size: int):
  """The hand-set attention head of the module docstring: tokens [B, L] -> logits [B, L, vocab]."""
  def logits(tokens):
    x = jax.nn.one_hot(tokens, vocab_size, dtype=jnp.float32)                  # [B, L, V]
    prev = jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :-1]                        # x_{j-1}
    L = tokens.shape[1]
    pos = jnp.arange(L, dtype=jnp.float32)
    match = 2.0 * L + 50.0  # beats any position penalty; a later match loses >= 1 per position
    scores = match * jnp.einsum("biv,bjv->bij", x, prev) - pos[None, None, :]
    causal = pos[None, :, None] >= pos[None, None, :]
    attn = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    return 10.0 * jnp.einsum("bij,bjv->biv", attn, x)
  return logits


def format_grid(rows: Sequence[dict]) -> str:
  """A markdown table: one row per sequence length, one column per number of kv pairs."""
  from lineax_lm.eval.report import pivot_table
  return pivot_table(rows, row="seq_len", col="num_kv_pairs", value="accuracy", fmt="{:.3f}")
