"""RULER-style aggregation and tracking tasks (Hsieh et al. 2024) and the task registry, generator
and evaluation loop shared with the needle tasks of `lineax_lm.eval.recall`.

  vt    variable tracking: two chains "VAR ABCDE = 1234567." -> "VAR FGHIJ = VAR ABCDE." ... (4 hops
        each) hidden in the haystack; the question asks every variable holding one chain's value.
  cwe   common words extraction: a numbered list where 10 words appear 30 times and the rest 3
        times; the question asks the 10 common ones (canonical order: first appearance).
  fwe   frequent words extraction: a "coded text" of pseudo-words drawn from a Zipf law (a = 2);
        the question asks the 3 most frequent ones (top counts strictly ordered).

Scoring (`evaluate_tasks`), per task and context length:
  mode="generate"  greedy generation with the model's `generate()` (prefill + cached decode), cut
                   at a newline, scored by RULER's string_match_all (fraction of references found).
  mode="teacher_forced"  one forward pass over prompt + canonical answer: accuracy 1 iff greedy
                   decoding would emit the canonical answer verbatim (exact), plus its log-likelihood.
                   Much cheaper on CPU; stricter (order and format must match). The answer's leading
                   whitespace-only tokens (the " " before "4033451") are given, not scored: a model
                   that writes "are: 4033451" has recalled the number (SmolLM2-135M does).
The brute-force solvers (`solve`) read only the prompt text; `score_predictions` is the one scoring
function for model outputs and solver outputs alike.
"""
from __future__ import annotations

import functools
import re
import string
from collections import Counter
from typing import Sequence

import numpy as np

from lineax_lm.eval import recall
from lineax_lm.eval.recall import Example, Haystack, TooShort, assemble, distinct, make_example
from lineax_lm.eval.scoring import (as_scorer, cut_at_stop, greedy_generate, score_pairs,
                                    string_match_all)

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192)


# ----------------------------------------------------------------------------- variable tracking
_VT_RE = re.compile(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d+))\.")
_VT_Q = re.compile(r"Find all variables that are assigned the value (\d+) in the text above\.")


def vt_example(tokenizer, length: int, seed: int, index: int, haystack: Haystack | None = None,
               num_chains: int = 2, num_hops: int = 4) -> Example:
  rng = np.random.default_rng((seed, index, length, 2))
  names = iter(distinct_names(rng, num_chains * (num_hops + 1)))
  values = distinct(rng, "numbers", num_chains)
  chains = []
  for value in values:
    chain = [next(names)]
    stmts = [f"VAR {chain[0]} = {value}."]
    for _ in range(num_hops):
      chain.append(next(names))
      stmts.append(f"VAR {chain[-1]} = VAR {chain[-2]}.")
    chains.append((chain, stmts))
  # Interleave the chains' statements, keeping each chain's order.
  owner = rng.permutation(np.repeat(np.arange(num_chains), num_hops + 1))
  its = [iter(stmts) for _, stmts in chains]
  inserts = [next(its[c]) for c in owner]
  head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
  chain0 = chains[0][0]
  tail = (f"\nQuestion: Find all variables that are assigned the value {values[0]} in the text above."
          f"\nAnswer: According to the chain(s) of variable assignment in the text above, "
          f"{len(chain0)} variables are assigned the value {values[0]}, they are:")
  ids, text = assemble(tokenizer, length, head, inserts, tail, (haystack or Haystack()).stream(rng),
                       rng, "vt", ordered=True)
  return make_example("vt", tokenizer, length, ids, text, chain0, " " + " ".join(chain0))


def distinct_names(rng, n: int) -> list[str]:
  out: list[str] = []
  while len(out) < n:
    name = "".join(rng.choice(list(string.ascii_uppercase), 5))
    if name not in out:
      out.append(name)
  return out


def solve_vt(prompt: str) -> list[str]:
  """Variables whose assignment chain resolves to the asked value, in order of assignment."""
  value = _VT_Q.findall(prompt)[-1]
  holds: dict[str, str] = {}
  for name, src, literal in _VT_RE.findall(prompt):
    holds[name] = literal if literal else holds.get(src, "")
  return [n for n, v in holds.items() if v == value]


# ----------------------------------------------------------------------------- word extraction
def _filled_list(tokenizer, length, head, tail, items, task):
  """Head, then the pieces of `items` (an iterable of str) while they fit, then newline padding, then
  tail: exactly `length` ids. Returns (ids, text, the pieces used)."""
  head_ids, tail_ids = recall.encode(tokenizer, head), recall.encode(tokenizer, tail)
  budget = length - len(head_ids) - len(tail_ids)
  if budget < 1:
    raise TooShort(f"task {task!r}: `length` = {length} cannot hold the instruction and the question")
  used, body = [], []
  for item in items:
    ids = recall.encode(tokenizer, item)
    if len(body) + len(ids) > budget:
      break
    used.append(item)
    body.extend(ids)
  newline = recall.encode(tokenizer, "\n")
  if (budget - len(body)) % len(newline):
    raise ValueError(f"task {task!r}: `length` = {length} cannot be filled exactly with this tokenizer "
                     "(its newline token count does not divide the remainder)")
  body.extend(newline * ((budget - len(body)) // len(newline)))
  all_ids = head_ids + body + tail_ids
  return np.asarray(all_ids, np.int32), tokenizer.decode(all_ids), used


def cwe_example(tokenizer, length: int, seed: int, index: int, haystack=None, num_common: int = 10,
                freq_common: int | None = None, freq_rare: int = 3) -> Example:
  """The largest number of rare words whose shuffled, numbered list still fits `length` (binary
  search), so every copy of every word is listed. freq_common None: RULER's 30, lowered (to at
  least 5) so that the common words take at most half of a short context."""
  del haystack
  rng = np.random.default_rng((seed, index, length, 3))
  common = distinct(rng, "words", num_common)
  rare = distinct(rng, "words", max(1, length // (2 * freq_rare)), avoid=common)
  head = "Below is a numbered list of words. In these words, some appear more often than others.\n"
  tail = (f"\nQuestion: What are the {num_common} most common words in the above list?"
          f"\nAnswer: The top {num_common} words that appear most often in the list are:")
  fixed = len(recall.encode(tokenizer, head)) + len(recall.encode(tokenizer, tail))
  if freq_common is None:
    item = len(recall.encode(tokenizer, f" {100}. {common[0]}"))
    freq_common = int(np.clip((length - fixed) // 2 // (num_common * item), 5, 30))

  def listing(n):
    words = [w for w in common for _ in range(freq_common)] + [w for w in rare[:n] for _ in range(freq_rare)]
    order = np.random.default_rng((seed, index, length, 3, n)).permutation(len(words))
    return [f" {i + 1}. {words[j]}" for i, j in enumerate(order)]

  def fits(n):
    return fixed + sum(len(recall.encode(tokenizer, it)) for it in listing(n)) <= length

  if not fits(0):
    raise TooShort(f"task 'cwe': `length` = {length} is too short for {num_common} common words x "
                   f"{freq_common}; use a longer length")
  lo, hi = 0, len(rare)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
  items = listing(lo)
  ids, text, used = _filled_list(tokenizer, length, head, tail, items, "cwe")
  assert len(used) == len(items)
  first = {}
  for it in items:
    first.setdefault(it.split(". ", 1)[1], len(first))
  answers = sorted(common, key=first.__getitem__)      # order of first appearance
  return make_example("cwe", tokenizer, length, ids, text, answers, " " + " ".join(answers))


def solve_cwe(prompt: str) -> list[str]:
  n = int(re.findall(r"What are the (\d+) most common words", prompt)[-1])
  counts = Counter(re.findall(r" \d+\. ([a-z]+)", prompt))
  return [w for w, _ in counts.most_common(n)]


def fwe_example(tokenizer, length: int, seed: int, index: int, haystack=None, alpha: float = 2.0,
                vocab: int = 200, top: int = 3) -> Example:
  del haystack
  for attempt in range(100):
    rng = np.random.default_rng((seed, index, length, 4, attempt))
    words = distinct(rng, "words", vocab)
    p = 1.0 / np.arange(1, vocab + 1) ** alpha
    p /= p.sum()
    head = ("Read the following coded text and track the frequency of each coded word. Find the "
            f"{top} most frequently appeared coded words.\n")
    tail = (f"\nQuestion: What are the {top} most frequently appeared words in the above coded text?"
            f"\nAnswer: According to the coded text above, the {top} most frequently appeared words are:")
    draws = (" " + words[i] for i in iter(lambda: rng.choice(vocab, p=p), None))
    ids, text, items = _filled_list(tokenizer, length, head, tail, draws, "fwe")
    counts = Counter(it.strip() for it in items).most_common(top + 1)
    c = [n for _, n in counts] + [0]
    if len(counts) >= top and all(c[i] > c[i + 1] for i in range(top)):
      answers = [w for w, _ in counts[:top]]
      return make_example("fwe", tokenizer, length, ids, text, answers, " " + " ".join(answers))
  raise ValueError(f"task 'fwe': no example with {top} strictly ordered top counts at length {length}")


def solve_fwe(prompt: str) -> list[str]:
  n = int(re.findall(r"What are the (\d+) most frequently appeared words", prompt)[-1])
  body = prompt.split("coded words.\n", 1)[1].split("\nQuestion:", 1)[0]
  return [w for w, _ in Counter(body.split()).most_common(n)]


# ----------------------------------------------------------------------------- registry
# name -> generator(tokenizer, length, seed, index, haystack) -> Example
TASKS = {name: functools.partial(recall.niah_example, name) for name in recall.NIAH_TASKS}
TASKS.update({"vt": vt_example, "cwe": cwe_example, "fwe": fwe_example})
SOLVERS = {**{name: recall.solve_niah for name in recall.NIAH_TASKS},
           "vt": solve_vt, "cwe": solve_cwe, "fwe": solve_fwe}
GROUPS = {"needle": tuple(recall.NIAH_TASKS), "ruler": tuple(TASKS)}


def resolve_tasks(names: str | Sequence[str]) -> list[str]:
  """Task names (or the groups "needle" / "ruler"), comma-separated or a list -> task names."""
  names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
  out = []
  for n in names:
    if n in GROUPS:
      out.extend(GROUPS[n])
    elif n in TASKS:
      out.append(n)
    else:
      raise ValueError(f"unknown recall task {n!r}; choose from {sorted(TASKS)} or {sorted(GROUPS)}")
  return list(dict.fromkeys(out))


def make_examples(task: str, tokenizer, length: int, num_examples: int, seed: int = 0,
                  corpus: Sequence[str] | None = None) -> list[Example]:
  """`num_examples` examples of `task` with exactly `length` prompt tokens each."""
  if task not in TASKS:
    raise ValueError(f"unknown recall task {task!r}; choose from {sorted(TASKS)}")
  hay = Haystack(corpus) if corpus else None
  return [TASKS[task](tokenizer, length, seed, i, hay) for i in range(num_examples)]


def solve(example: Example) -> list[str]:
  return SOLVERS[example.task](example.prompt)


def score_predictions(examples: Sequence[Example], predictions: Sequence[str]) -> float:
  """Mean RULER string_match_all of predictions (texts) against the examples' answers."""
  return float(np.mean([string_match_all(p, e.answers) for e, p in zip(examples, predictions)]))


def predict(model, tokenizer, examples: Sequence[Example], batch_size: int = 8,
            max_new_tokens: int | None = None, bar=None) -> list[str]:
  """Greedy generations (cut at the first newline) for examples of one length. Every group is
  `batch_size` prompts (the last one filled up with copies) and generates `max_new_tokens` (None:
  the longest answer + 8), so one compiled program serves every group and, given one
  `max_new_tokens`, every task of the length. `bar`: a tqdm bar advanced by each group's examples."""
  new = max_new_tokens or max(len(e.answer_ids) for e in examples) + 8
  prompts = np.stack([e.prompt_ids for e in examples])
  out = []
  for s in range(0, len(examples), batch_size):
    group = prompts[s:s + batch_size]
    filled = np.concatenate([group, np.repeat(group[-1:], batch_size - len(group), axis=0)])
    gen = greedy_generate(model, filled, new)[:len(group)]
    out.extend(cut_at_stop(tokenizer.decode(g.tolist()), ("\n",)) for g in gen)
    if bar is not None:
      bar.update(len(group))
  return out


def forced_pair(tokenizer, example: Example) -> tuple[list[int], list[int]]:
  """(context, continuation) ids for teacher-forced scoring: the answer's leading tokens that decode
  to whitespace alone join the context (a separator is format, not recall). Tokenizers that merge the
  space into the first answer token (" 4") keep it in the scored part."""
  ids = example.answer_ids.tolist()
  n = 0
  while n < len(ids) - 1 and not tokenizer.decode(ids[:n + 1]).strip():
    n += 1
  return example.prompt_ids.tolist() + ids[:n], ids[n:]


def evaluate_tasks(model, tokenizer, tasks="ruler", lengths: Sequence[int] = DEFAULT_LENGTHS,
                   num_examples: int = 20, seed: int = 0, mode: str = "generate",
                   corpus: Sequence[str] | None = None, batch_size: int = 8,
                   progress: bool = False) -> list[dict]:
  """Rows {"task", "length", "accuracy", "mode", "num_examples"[, "answer_logprob"]} per task and
  length (accuracy in [0, 1]; None where the length cannot hold the task). progress: a tqdm bar
  (tqdm.auto: a widget in notebooks) over the examples, for runs of many minutes (a teacher
  scored on a CPU)."""
  if mode not in ("generate", "teacher_forced"):
    raise ValueError(f"`mode` must be 'generate' or 'teacher_forced'; got {mode!r}")
  lengths = list(lengths)
  if not lengths or min(lengths) < 1:
    raise ValueError(f"`lengths` must be one or more integers >= 1; got {lengths}")
  if num_examples < 1:
    raise ValueError(f"`num_examples` must be >= 1; got {num_examples}")
  task_names = resolve_tasks(tasks)
  scorer = as_scorer(model, batch_size) if mode == "teacher_forced" else None
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(lengths) * len(task_names) * num_examples, unit="example",
               desc="recall tasks", dynamic_ncols=True)
  rows = {}
  for L in lengths:
    examples = {}
    for task in task_names:
      try:
        examples[task] = make_examples(task, tokenizer, L, num_examples, seed, corpus)
      except TooShort:            # e.g. four UUID needles in 512 byte tokens: reported as "-"
        examples[task] = None
    # one generation length for every task of L: one compiled program per length
    new = max((len(e.answer_ids) for ex in examples.values() if ex for e in ex), default=0) + 8
    for task, ex in examples.items():
      row = dict(task=task, length=L, mode=mode, num_examples=num_examples, accuracy=None)
      if bar is not None:
        bar.set_postfix(task=task, length=L)
      if ex is None:
        pass
      elif mode == "generate":
        row["accuracy"] = score_predictions(ex, predict(model, tokenizer, ex, batch_size, new, bar))
      else:
        res = score_pairs(scorer, [forced_pair(tokenizer, e) for e in ex])
        row["accuracy"] = float(np.mean([g for _, g in res]))
        row["answer_logprob"] = float(np.mean([ll for ll, _ in res]))
      if bar is not None and (ex is None or mode != "generate"):
        bar.update(num_examples)
      rows[task, L] = row
  if bar is not None:
    bar.close()
  return [rows[task, L] for task in task_names for L in lengths]


def ruler_means(rows: Sequence[dict]) -> dict:
  """{"ruler_mean": mean accuracy over every task and length that has one, "ruler_mean_<L>": the
  mean over the tasks at length L} of `evaluate_tasks` rows (a RULER-like average; rows whose
  length cannot hold the task, accuracy None, are left out)."""
  scored = [r for r in rows if r["accuracy"] is not None]
  out = {"ruler_mean": float(np.mean([r["accuracy"] for r in scored])) if scored else None}
  for L in dict.fromkeys(r["length"] for r in rows):
    at = [r["accuracy"] for r in scored if r["length"] == L]
    out[f"ruler_mean_{L}"] = float(np.mean(at)) if at else None
  return out
