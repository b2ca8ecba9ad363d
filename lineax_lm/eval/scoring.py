"""Scoring primitives every evaluation shares: a jitted per-token scorer over padded shape buckets,
log-likelihoods of (context, continuation) token pairs, rolling windows for long texts, greedy
generation and RULER's string match.

A "model" here is a `HybridLM` or any jax-traceable callable `tokens [B, L] int32 -> logits
[B, L, V] float32` (the MQAR oracle is one). Logits never leave the device: the jitted scorer
returns only each target's log-probability and whether it is the argmax, so an 8k-token batch of a
32k vocabulary costs [B, L] floats of transfer, not [B, L, V].

Shapes are padded to buckets (batch to a multiple of `batch_size`, length to a power of two >= 16)
so a whole evaluation compiles a handful of programs. Padding sits on the right and the models are
causal, so it never changes the scores of real positions.

Teacher-forced greedy match is exact greedy decoding: the model emits a continuation under greedy
decoding iff every continuation token is the argmax given the tokens before it, so
`score_pairs(...)[i][1]` equals "greedy generation reproduces the continuation verbatim" and costs
one forward pass instead of one per token.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

MIN_BUCKET = 16


def bucket(n: int, minimum: int = MIN_BUCKET) -> int:
  """The padded length for a sequence of n tokens: the next power of two, at least `minimum`."""
  return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


class Scorer:
  """Per-token log-probabilities and greedy flags of a model, jitted once per bucket shape.

    scorer = Scorer(model, batch_size=8)
    logp, greedy = scorer(inputs, targets)      # [B, L] int arrays -> [B, L] float32, [B, L] bool

  `min_length` raises the smallest bucket: an evaluation that scores several lengths up to L
  (needles at 256 ... 2,048 tokens, MQAR at 512) passes min_length=L and compiles one program
  instead of one per power of two, where compiling a deep model costs more than the padded tokens.
  """

  def __init__(self, model, batch_size: int = 8, min_length: int = MIN_BUCKET):
    if batch_size < 1:
      raise ValueError(f"`batch_size` must be >= 1; got {batch_size}")
    if min_length < 1:
      raise ValueError(f"`min_length` must be >= 1; got {min_length}")
    self.model, self.batch_size, self.min_length = model, batch_size, min_length
    if isinstance(model, nnx.Module):
      graphdef, self._state = nnx.split(model)
    else:
      graphdef, self._state = model, None
    self._scores = _jitted_scores(graphdef)

  def __call__(self, inputs, targets):
    """inputs, targets: [B, L] ints -> (log p(target) [B, L] float32, target is argmax [B, L] bool)."""
    inputs, targets = np.asarray(inputs, np.int32), np.asarray(targets, np.int32)
    if inputs.ndim != 2 or inputs.shape != targets.shape:
      raise ValueError(f"`inputs` and `targets` must both be [B, L]; got {inputs.shape} and "
                       f"{targets.shape}")
    B, L = inputs.shape
    Lp, Bp = bucket(L, self.min_length), -(-B // self.batch_size) * self.batch_size
    pad = ((0, Bp - B), (0, Lp - L))
    logps, greedys = [], []
    x, t = np.pad(inputs, pad), np.pad(targets, pad)
    for s in range(0, Bp, self.batch_size):
      lp, g = self._scores(self._state, x[s:s + self.batch_size], t[s:s + self.batch_size])
      logps.append(np.asarray(lp))
      greedys.append(np.asarray(g))
    return np.concatenate(logps)[:B, :L], np.concatenate(greedys)[:B, :L]


@functools.lru_cache(maxsize=32)
def _jitted_scores(graphdef):
  """One jitted scorer per model structure (an nnx GraphDef, or a callable), shared by Scorers."""
  if isinstance(graphdef, nnx.GraphDef):
    forward = lambda state, x: nnx.merge(graphdef, state)(x)
  else:
    forward = lambda state, x: graphdef(x)

  def scores(state, inputs, targets):
    logits = forward(state, inputs).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return target_logp, jnp.argmax(logits, axis=-1) == targets

  return jax.jit(scores)


def as_scorer(model_or_scorer, batch_size: int = 8) -> Scorer:
  return model_or_scorer if isinstance(model_or_scorer, Scorer) else Scorer(model_or_scorer, batch_size)


def masked_accuracy(scorer: Scorer, batch: dict) -> tuple[float, float]:
  """Teacher-forced next-token accuracy on the positions of `batch["loss_mask"]` (the trainer's and
  Zoology's MQAR metric). batch: {"inputs", "targets", "loss_mask"}: [B, L] each.
  Returns (number correct, number scored)."""
  _, greedy = scorer(batch["inputs"], batch["targets"])
  mask = np.asarray(batch["loss_mask"]) > 0
  return float(np.sum(greedy & mask)), float(np.sum(mask))


def score_pairs(scorer: Scorer, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                max_len: int | None = None) -> list[tuple[float, bool]]:
  """Log-likelihood of each continuation given its context, and whether greedy decoding produces it.

  pairs: (context ids, continuation ids); the context must hold at least one id (use a bos / eot
  prefix for an empty one) and the continuation at least one. With `max_len`, a sequence longer than
  max_len + 1 ids keeps its last max_len + 1 (the context is cut from the left, as lm-eval does).
  Returns [(sum of log p(continuation), every continuation token greedy)] in the order of `pairs`.
  Sequences are grouped by length bucket (sorted), so batches waste little padding.
  """
  rows = []
  for i, (ctx, cont) in enumerate(pairs):
    ctx, cont = list(ctx), list(cont)
    if not ctx or not cont:
      raise ValueError(f"pair {i}: the context and the continuation must each hold >= 1 token id "
                       f"(got {len(ctx)} and {len(cont)}); prefix an empty context with bos / eot")
    seq = ctx + cont
    if max_len is not None and len(seq) > max_len + 1:
      if len(cont) > max_len:
        raise ValueError(f"pair {i}: the continuation ({len(cont)} ids) is longer than "
                         f"`max_len` = {max_len}")
      seq = seq[-(max_len + 1):]
    rows.append((i, np.asarray(seq, np.int32), len(cont)))
  out: list = [None] * len(rows)
  rows.sort(key=lambda r: len(r[1]))
  B = scorer.batch_size
  for s in range(0, len(rows), B):
    group = rows[s:s + B]
    L = max(len(seq) for _, seq, _ in group) - 1
    inputs, targets = np.zeros((len(group), L), np.int32), np.zeros((len(group), L), np.int32)
    for j, (_, seq, _) in enumerate(group):
      inputs[j, :len(seq) - 1], targets[j, :len(seq) - 1] = seq[:-1], seq[1:]
    logp, greedy = scorer(inputs, targets)
    for j, (i, seq, n) in enumerate(group):
      end = len(seq) - 1
      out[i] = (float(np.sum(logp[j, end - n:end])), bool(np.all(greedy[j, end - n:end])))
  return out


def rolling_windows(ids: Sequence[int], prefix_id: int, max_len: int) -> list[tuple[list, list]]:
  """(context, continuation) pairs that predict every id of `ids` exactly once, each with as much
  context as fits in `max_len` (lm-eval's rolling windows; the first id is predicted from
  `prefix_id`, usually bos / eot). Scoring them with `score_pairs` and summing gives the
  log-likelihood of the whole text."""
  ids = list(ids)
  if max_len < 1:
    raise ValueError(f"`max_len` must be >= 1; got {max_len}")
  pairs, pos = [], 0
  while pos < len(ids):
    n = min(max_len, len(ids) - pos)                     # ids predicted by this window
    full = ([prefix_id] + ids)[max(0, pos + n - max_len):pos + n]   # inputs: the max_len ids before
    ctx_len = len(full) - n + 1                          # inputs that only give context
    pairs.append((full[:ctx_len], ids[pos:pos + n]))
    pos += n
  return pairs


def loglikelihood_rolling(scorer: Scorer, ids: Sequence[int], prefix_id: int, max_len: int) -> float:
  """log p(ids | prefix_id) summed over rolling windows of at most `max_len` tokens."""
  if not len(ids):
    return 0.0
  return sum(ll for ll, _ in score_pairs(scorer, rolling_windows(ids, prefix_id, max_len), max_len))


def greedy_generate(model, prompts, max_new_tokens: int, eos_id: int | None = None) -> np.ndarray:
  """Greedy continuation of equal-length prompts with the model's `generate()` (prefill with the chunk
  ops, then cached decode). prompts: [B, P] ints -> [B, max_new_tokens] int32."""
  prompts = np.asarray(prompts, np.int32)
  if not hasattr(model, "generate"):
    raise ValueError(f"greedy generation needs a model with `generate()` (HybridLM); got "
                     f"{type(model).__name__}: score it teacher-forced instead")
  out = model.generate(prompts, max_new_tokens, temperature=0.0, eos_id=eos_id)
  return np.asarray(out)[:, prompts.shape[1]:]


def cut_at_stop(text: str, stops: Sequence[str] = ()) -> str:
  """`text` up to the first occurrence of any stop string."""
  cut = len(text)
  for s in stops:
    if s:
      i = text.find(s)
      if i >= 0:
        cut = min(cut, i)
  return text[:cut]


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
  """RULER's metric: the fraction of the reference answers found (case-insensitive) in the prediction."""
  if not answers:
    raise ValueError("`answers` is empty")
  pred = prediction.lower()
  return sum(a.lower() in pred for a in answers) / len(answers)

