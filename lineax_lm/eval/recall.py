"""Needle-in-a-haystack tasks (RULER's NIAH family, Hsieh et al. 2024), generated from any corpus or
from built-in noise, with numbers, UUIDs or pseudo-words as keys and values; no downloads.

Every example is a pure function of (task, tokenizer, length, seed, index) and holds exactly
`length` prompt tokens, so the examples of one length batch into one [N, length] array (one compile
of `generate()` per length). A prompt reads

  Some special magic numbers are hidden in the following text. Memorize them.
  <haystack sentences, with needles at random depths:
     " One of the special magic numbers for {key} is: {value}.">
  What are all the special magic numbers for {key(s)} mentioned in the provided text?
  The special magic numbers for {key(s)} mentioned in the provided text are

and the answer is " {value}" (several: " v1, v2, ..."). Tasks (RULER's names and settings):
  niah_single        one needle; word key, 7-digit number value
  niah_single_uuid   one needle; word key, UUID value
  niah_multikey      four needles with different keys, one asked (three distractors)
  niah_multikey_uuid the same with UUID keys and values
  niah_multivalue    four needles with the same key; all four values asked
  niah_multiquery    four needles with different keys; all four asked

The haystack is RULER's "noise" sentences unless a corpus (a list of texts) is given, whose
sentences are then used in order from a seeded start. The length budget is filled exactly by
cutting the last haystack sentence at a token. `solve_niah` is a brute-force solver that reads only
the prompt text (regular expressions over the needles and the question): the tests check that it
recovers every label, and it is the text-level oracle.
"""
from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Sequence

import numpy as np

NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
         "There and back again.")
_SYLLABLES = ("ba", "ko", "mi", "ru", "te", "zo", "la", "ne", "vi", "su", "da", "po", "ki", "fa",
              "lo", "me", "tu", "ga", "ri", "no", "xe", "ha", "ju", "we")


class TooShort(ValueError):
  """The requested length cannot hold the task's fixed parts (instruction, needles, question)."""


@dataclasses.dataclass(frozen=True)
class Example:
  """One evaluation example.

  task: the task name. length: the number of prompt tokens (== len(prompt_ids)).
  prompt_ids: [length] int32 token ids. prompt: their decoded text (what the solver reads).
  answers: reference strings; RULER's score is the fraction found in the model's output.
  answer_ids: token ids of the canonical answer text (teacher-forced scoring).
  answer_text: the canonical answer text, e.g. " 1234567, 7654321".
  """
  task: str
  length: int
  prompt_ids: np.ndarray
  prompt: str
  answers: tuple
  answer_ids: np.ndarray
  answer_text: str


# ----------------------------------------------------------------------------- random atoms
def number(rng) -> str:
  return str(int(rng.integers(1_000_000, 10_000_000)))


def make_uuid(rng) -> str:
  return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "big"), version=4))


def word(rng, syllables: int = 3) -> str:
  return "".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), syllables))


ATOMS = {"numbers": number, "uuids": make_uuid, "words": word}


def distinct(rng, kind: str, n: int, avoid=()) -> list[str]:
  """n distinct atoms of `kind` ("numbers" | "uuids" | "words"), none in `avoid`."""
  if kind not in ATOMS:
    raise ValueError(f"atom kind must be one of {sorted(ATOMS)}; got {kind!r}")
  out, seen = [], set(avoid)
  while len(out) < n:
    a = ATOMS[kind](rng)
    if a not in seen:
      seen.add(a)
      out.append(a)
  return out


# ----------------------------------------------------------------------------- haystack
def split_sentences(texts: Sequence[str]) -> list[str]:
  """Sentences (ending in . ! ? or a line end) of `texts`, whitespace-normalised."""
  out = []
  for t in texts:
    for s in re.split(r"(?<=[.!?])\s+|\n+", t):
      s = " ".join(s.split())
      if s:
        out.append(s)
  return out


class Haystack:
  """An endless stream of haystack sentences: RULER's noise, or a corpus's sentences from a seeded
  start (cycling)."""

  def __init__(self, corpus: Sequence[str] | None = None):
    self.sentences = split_sentences(corpus) if corpus else split_sentences([NOISE])
    if not self.sentences:
      raise ValueError("`corpus` holds no sentence")

  def stream(self, rng):
    i = int(rng.integers(0, len(self.sentences)))
    while True:
      yield self.sentences[i % len(self.sentences)]
      i += 1


# ----------------------------------------------------------------------------- assembly
def encode(tokenizer, text: str) -> list[int]:
  return list(tokenizer.encode(text))


def assemble(tokenizer, length: int, head: str, inserts: Sequence[str], tail: str, filler, rng,
             task: str, ordered: bool = False) -> tuple[np.ndarray, str]:
  """Prompt ids of exactly `length` tokens: head, filler sentences with `inserts` placed at random
  sentence boundaries (in the given order when `ordered`, else shuffled), then tail.

  filler: an iterator of filler pieces (str). The last filler piece is cut at a token to fill the
  budget. Returns (ids [length] int32, decoded text)."""
  head_ids, tail_ids = encode(tokenizer, head), encode(tokenizer, tail)
  insert_ids = [encode(tokenizer, " " + s) for s in inserts]
  budget = length - len(head_ids) - len(tail_ids) - sum(map(len, insert_ids))
  if budget < 1:
    raise TooShort(f"task {task!r}: `length` = {length} tokens cannot hold the instruction, the "
                     f"needles and the question ({length - budget} tokens); use a longer length")
  pieces, used = [], 0
  while used < budget:
    ids = encode(tokenizer, (" " if pieces else "") + next(filler))
    ids = ids[:budget - used]
    pieces.append(ids)
    used += len(ids)
  # Boundaries 0..len(pieces)-1 (before piece j), never after the cut last piece.
  slots = np.sort(rng.integers(0, len(pieces), len(insert_ids)))
  order = range(len(insert_ids)) if ordered else rng.permutation(len(insert_ids))
  at: dict[int, list] = {}
  for slot, k in zip(slots, order):
    at.setdefault(int(slot), []).append(insert_ids[k])
  body = []
  for j, ids in enumerate(pieces):
    for ins in at.get(j, ()):
      body.extend(ins)
    body.extend(ids)
  all_ids = head_ids + body + tail_ids
  assert len(all_ids) == length, (len(all_ids), length)
  return np.asarray(all_ids, np.int32), tokenizer.decode(all_ids)


def make_example(task, tokenizer, length, ids, text, answers, answer_text) -> Example:
  return Example(task, length, ids, text, tuple(answers),
                 np.asarray(encode(tokenizer, answer_text), np.int32), answer_text)


# ----------------------------------------------------------------------------- NIAH
NIAH_TASKS = {
    # name: (num keys in the haystack, values per key, keys asked, key kind, value kind)
    "niah_single": (1, 1, 1, "words", "numbers"),
    "niah_single_uuid": (1, 1, 1, "words", "uuids"),
    "niah_multikey": (4, 1, 1, "words", "numbers"),
    "niah_multikey_uuid": (4, 1, 1, "uuids", "uuids"),
    "niah_multivalue": (1, 4, 1, "words", "numbers"),
    "niah_multiquery": (4, 1, 4, "words", "numbers"),
}

_NEEDLE = "One of the special magic {vt} for {key} is: {value}."
_QUESTION = "\nWhat are all the special magic {vt} for {keys} mentioned in the provided text?"
_PREFIX = "\nThe special magic {vt} for {keys} mentioned in the provided text are"
_NEEDLE_RE = re.compile(r"One of the special magic \w+ for (\S+) is: (\S+)\.")
_QUESTION_RE = re.compile(r"What are all the special magic \w+ for (.+?) mentioned in the provided text\?")


def niah_example(task: str, tokenizer, length: int, seed: int, index: int,
                 haystack: Haystack | None = None) -> Example:
  """Example `index` of NIAH task `task` (a key of NIAH_TASKS) at `length` tokens."""
  if task not in NIAH_TASKS:
    raise ValueError(f"unknown NIAH task {task!r}; choose one of {sorted(NIAH_TASKS)}")
  num_keys, num_values, num_queries, key_kind, value_kind = NIAH_TASKS[task]
  rng = np.random.default_rng((seed, index, length, sum(map(ord, task))))
  keys = distinct(rng, key_kind, num_keys)
  values = [distinct(rng, value_kind, num_values) for _ in keys]
  pairs = [(k, v) for k, vs in zip(keys, values) for v in vs]
  pairs = [pairs[i] for i in rng.permutation(len(pairs))]      # the order they appear in the text
  asked = keys[:num_queries]                                   # the other keys distract
  keys_text = ", ".join(asked)
  head = f"Some special magic {value_kind} are hidden in the following text. Memorize them.\n"
  tail = _QUESTION.format(vt=value_kind, keys=keys_text) + _PREFIX.format(vt=value_kind, keys=keys_text)
  answers = [v for a in asked for k, v in pairs if k == a]     # question order, then text order
  needles = [_NEEDLE.format(vt=value_kind, key=k, value=v) for k, v in pairs]
  ids, text = assemble(tokenizer, length, head, needles, tail, (haystack or Haystack()).stream(rng),
                       rng, task, ordered=True)
  return make_example(task, tokenizer, length, ids, text, answers, " " + ", ".join(answers))


def solve_niah(prompt: str) -> list[str]:
  """Brute force from the text alone: the values of every needle whose key the question asks, in the
  order the keys are asked and the needles appear."""
  question = _QUESTION_RE.findall(prompt)
  if not question:
    raise ValueError("no NIAH question in the prompt")
  asked = question[-1].split(", ")
  needles = _NEEDLE_RE.findall(prompt)
  return [v for k in asked for key, v in needles if key == k]
