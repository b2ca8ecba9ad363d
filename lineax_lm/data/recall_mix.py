"""Synthetic in-context retrieval rows mixed into a text stream (`data.recall_mix`).

A small model trained on a few million tokens of text sees too few retrievable repetitions to learn
in-context recall, so recall benchmarks then read zero whatever the architecture. Mixing rows that
can only be predicted by looking a value up earlier in the row (the Zoology approach: Arora et al.,
2023, train on multi-query associative recall) gives every architecture the same recall signal; the
benchmarks then measure how much of it each one learnt.

  c.data.recall_mix.fraction = 0.25          # a quarter of the training rows (0: none, the default)
  c.data.recall_mix.kinds = "mqar,kv_text"   # the row kinds, taking turns

Kinds (every row exactly `data.seq_len` next-token pairs, one sequence):
  mqar     Zoology MQAR examples (`lineax_lm.data.mqar.mqar_example`, the one MQAR generator) over
           the ids [0, min(256, vocab)): key-value pairs, then queries of the keys among random
           ids; loss on the queried values only (the rest is noise). By default one example of
           `mqar_kv_pairs` pairs fills the row; `mqar_shapes` ("64x4,128x8,...", length x pairs)
           packs several examples into it instead, each its own sequence (segment ids 1, 2, ...,
           positions from 0), as Zoology trains on a mix of short easy shapes and long hard ones:
           the short ones are where a model first learns to look a key up, and a 1,024-token
           example of 16 or 64 pairs alone gives a model from scratch almost nothing to start on.
  kv_text  a text document of facts "the <thing> of <key> is <value>" and later questions about
           them, in one of a few phrasings, tokenized like the corpus; the LM loss on every token.
           Keys are random lowercase strings and values random numbers of 3 to 8 digits, so only a
           look-up predicts an answer. The phrasings are not those of the RULER-style needles
           (`lineax_lm.eval.recall`: "special magic numbers", syllable keys, 7-digit values), so a
           needle score measures transfer from these rows, not the evaluation task learnt verbatim.

Row i of the synthetic stream is kind `kinds[i % len(kinds)]`, a pure function of (seed, i); the
stream is mixed with the packed text rows by grain's `IterDataset.mix` (an exact interleave:
fraction 0.25 puts one synthetic row after every three text rows) before batching, so every batch
holds the same share and the iterator state (both streams' positions and the mix's index) is saved
and restored with the checkpoint like the rest of the pipeline. Only the training split mixes:
`data.split="heldout"` reads the held-out text alone, which is what perplexity and bits per byte
score.
"""
from __future__ import annotations

import grain
import numpy as np

from lineax_lm.data.mqar import mqar_example
from lineax_lm.data.packing import lm_example

KINDS = ("mqar", "kv_text")
# Rows the synthetic source indexes: more than any run reads, and no memory (rows are generated).
NUM_ROWS = 1 << 40
MQAR_VOCAB = 256          # MQAR ids are the first 256 token ids (the bytes, for the byte tokenizer)
MQAR_POWER_A = 0.01       # Zoology's gap distribution
_KV_TEXT_STREAM = 0x6b76  # separates kv_text's random stream from mqar's at the same (seed, index)

# (statement, question); "{value}" ends both, so the answer's tokens follow the question.
KV_TEXT_PHRASINGS = (
    ("The {thing} of {key} is {value}.", "Q: the {thing} of {key}? A: {value}."),
    ("{key} has {thing} {value}.", "Which {thing} does {key} have? {value}."),
    ("Record {key}: {thing} {value}.", "Look up {key}. Its {thing}: {value}."),
    ("{key} = {value}", "{key} -> {value}"),
)
KV_TEXT_THINGS = ("pass code", "locker number", "ticket", "room", "account number", "badge id",
                  "pin", "order number")
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def default_recall_mix_config() -> dict:
  """The fields of `data.recall_mix` with their defaults (no mix)."""
  return dict(
      fraction=0.0,            # share of training rows that are synthetic, in [0, 1); 0: none
      kinds="mqar,kv_text",    # comma-separated KINDS, taking turns
      mqar_kv_pairs=32,        # key-value pairs of an mqar row (4 * pairs <= data.seq_len)
      # "" : one example a row (above); "LxN,...": examples of length L and N pairs packed into the
      # row instead (the lengths sum to data.seq_len; 4 * N <= L)
      mqar_shapes="",
      # The loss weight of a queried value of an mqar row (its loss_mask): the loss is a mean over
      # weighted tokens, where a row of 32 queries among 1,024 text tokens a row would otherwise
      # be 1/32 of a text row; seq_len // (queries a row) makes it weigh as much as one.
      mqar_loss_weight=1)


def parse_kinds(kinds) -> tuple[str, ...]:
  """"mqar,kv_text" (or a sequence) -> ("mqar", "kv_text"); a ValueError naming the field."""
  names = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else list(kinds)
  names = [k for k in names if k]
  if not names or any(k not in KINDS for k in names):
    raise ValueError(f"`data.recall_mix.kinds` must name one or more of {KINDS} (comma-separated); "
                     f"got {kinds!r}")
  return tuple(dict.fromkeys(names))


def check_recall_mix(mix, *, source: str, seq_len: int, vocab_size: int,
                     max_segments: int | None = None, packed: bool = True) -> float:
  """The mix's fraction (0: none) after checking every field; a ValueError names the bad one.
  packed: whether rows carry segment ids (`data.packing` other than 'none'), which `mqar_shapes`
  needs to keep its examples apart."""
  fraction = mix.get("fraction", 0.0)
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
    raise ValueError(f"`data.recall_mix.fraction` must be a number in [0, 1) (the share of training "
                     f"rows that are synthetic recall rows; 0: none); got {fraction!r}")
  if not fraction:
    return 0.0
  if source == "mqar":
    raise ValueError("`data.recall_mix.fraction` > 0 mixes recall rows into text; `data.source` is "
                     "'mqar', which is all recall already: set the fraction to 0")
  kinds = parse_kinds(mix.get("kinds", "mqar"))
  if "mqar" in kinds:
    vocab = min(MQAR_VOCAB, vocab_size)
    shapes = parse_mqar_shapes(mix.get("mqar_shapes", ""), seq_len=seq_len, vocab=vocab)
    if shapes and not packed:
      raise ValueError("`data.recall_mix.mqar_shapes` packs several MQAR examples into a row, which "
                       "needs segment ids: `data.packing` must not be 'none'")
    if max_segments is not None and len(shapes) > max_segments:
      raise ValueError(f"`data.recall_mix.mqar_shapes` packs {len(shapes)} examples into a row, more "
                       f"sequences than data.max_segments = {max_segments} (the model's bound)")
    pairs = mix.get("mqar_kv_pairs")
    if not shapes and (not isinstance(pairs, int) or isinstance(pairs, bool) or pairs < 1
                       or 4 * pairs > seq_len or vocab // 2 - 1 < pairs):
      raise ValueError(f"`data.recall_mix.mqar_kv_pairs` must be an int >= 1 with 4 * pairs <= "
                       f"data.seq_len = {seq_len} and pairs <= {vocab // 2 - 1} (distinct keys "
                       f"among {vocab} ids); got {pairs!r}")
    weight = mix.get("mqar_loss_weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
      raise ValueError(f"`data.recall_mix.mqar_loss_weight` must be an int >= 1; got {weight!r}")
  return float(fraction)


def parse_mqar_shapes(shapes, *, seq_len: int, vocab: int = MQAR_VOCAB) -> tuple[tuple[int, int], ...]:
  """"64x4,128x8" -> ((64, 4), (128, 8)) (length, key-value pairs); "" -> (). A ValueError naming
  `data.recall_mix.mqar_shapes` unless the lengths sum to `seq_len` and every shape is a valid
  MQAR example (4 * pairs <= length, pairs <= vocab // 2 - 1)."""
  if not shapes:
    return ()
  field = "`data.recall_mix.mqar_shapes`"
  try:
    parsed = tuple(tuple(int(n) for n in item.strip().lower().split("x"))
                   for item in shapes.split(",") if item.strip())
  except (AttributeError, ValueError):
    parsed = ((),)
  if not parsed or any(len(p) != 2 for p in parsed):
    raise ValueError(f"{field} must be \"\" or comma-separated LENGTHxPAIRS items "
                     f"(\"64x4,128x8\"); got {shapes!r}")
  bad = [f"{n}x{p}" for n, p in parsed if p < 1 or 4 * p > n or p > vocab // 2 - 1]
  if bad:
    raise ValueError(f"{field}: every shape needs 1 <= pairs, 4 * pairs <= length and pairs <= "
                     f"{vocab // 2 - 1} (distinct keys among {vocab} ids); {', '.join(bad)} "
                     f"{'is' if len(bad) == 1 else 'are'} not")
  if sum(n for n, _ in parsed) != seq_len:
    raise ValueError(f"{field}: the lengths must sum to data.seq_len = {seq_len} (one row); "
                     f"{shapes!r} sums to {sum(n for n, _ in parsed)}")
  return parsed


class RecallRows:
  """The synthetic rows (grain random-access source): `rows[i]` is row i, a pure function of
  (seed, i) ({"inputs", "targets", "loss_mask"}, [seq_len] int32 each, plus "segment_ids" and
  "positions" when `with_segments`, as packed text rows have: one sequence, or one per example of
  `mqar_shapes`, which therefore needs `with_segments`: check_recall_mix checks it)."""

  def __init__(self, *, kinds, seq_len: int, tokenizer, seed: int, mqar_kv_pairs: int = 32,
               mqar_loss_weight: int = 1, mqar_shapes: str = "", with_segments: bool = True):
    self.kinds, self.seq_len, self.tokenizer = parse_kinds(kinds), seq_len, tokenizer
    self.seed, self.mqar_kv_pairs, self.with_segments = seed, mqar_kv_pairs, with_segments
    self.mqar_loss_weight = mqar_loss_weight
    self.mqar_shapes = parse_mqar_shapes(mqar_shapes, seq_len=seq_len)

  def __len__(self) -> int:
    return NUM_ROWS

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    index = int(index)
    kind = self.kinds[index % len(self.kinds)]
    shapes = ((self.seq_len, self.mqar_kv_pairs),)
    if kind == "mqar":
      shapes = self.mqar_shapes or shapes
      vocab = min(MQAR_VOCAB, self.tokenizer.vocab_size)
      # example j of row i is example i * len(shapes) + j of the stream: a pure function of it
      parts = [mqar_example(index * len(shapes) + j, seed=self.seed, vocab_size=vocab, seq_len=n,
                            num_kv_pairs=pairs, power_a=MQAR_POWER_A)
               for j, (n, pairs) in enumerate(shapes)]
      row = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
      row["loss_mask"] = row["loss_mask"] * np.int32(self.mqar_loss_weight)
    else:
      row = lm_example(kv_text_ids(self.tokenizer, self.seq_len + 1, self.seed, index))
    if self.with_segments:
      row["segment_ids"] = np.repeat(np.arange(1, len(shapes) + 1, dtype=np.int32),
                                     [n for n, _ in shapes])
      row["positions"] = np.concatenate([np.arange(n, dtype=np.int32) for n, _ in shapes])
    return row

  def __repr__(self) -> str:
    return f"RecallRows(kinds={self.kinds}, seq_len={self.seq_len}, seed={self.seed})"


def kv_text_document(seed: int, index: int, num_chars: int) -> str:
  """A kv_text document of at least `num_chars` characters (see the module docstring): one phrasing
  and thing, statements of new facts and questions about stated ones taking random turns, so the
  distance from a fact to its question ranges from a line to the whole document."""
  rng = np.random.default_rng((seed, index, _KV_TEXT_STREAM))
  statement, question = KV_TEXT_PHRASINGS[int(rng.integers(len(KV_TEXT_PHRASINGS)))]
  thing = KV_TEXT_THINGS[int(rng.integers(len(KV_TEXT_THINGS)))]
  separator = "\n" if rng.random() < 0.5 else " "
  facts: dict[str, str] = {}
  lines, size = [], 0
  while size < num_chars:
    if not facts or rng.random() < 0.5:
      key = "".join(rng.choice(_LETTERS, int(rng.integers(4, 9))))
      if key in facts:
        continue
      num_digits = int(rng.integers(3, 9))
      value = str(int(rng.integers(10 ** (num_digits - 1), 10 ** num_digits)))
      facts[key] = value
      line = statement.format(thing=thing, key=key, value=value)
    else:
      key = list(facts)[int(rng.integers(len(facts)))]
      line = question.format(thing=thing, key=key, value=facts[key])
    size += len(line) + (len(separator) if lines else 0)
    lines.append(line)
  return separator.join(lines)


def kv_text_ids(tokenizer, num_ids: int, seed: int, index: int) -> np.ndarray:
  """bos and the kv_text document (seed, index), cut to exactly `num_ids` ids."""
  ids = []
  chars = num_ids
  while len(ids) < num_ids:  # a tokenizer of more than one character per id: a longer document
    ids = [tokenizer.bos_id] + list(tokenizer.encode(kv_text_document(seed, index, chars)))
    chars *= 2
  return np.asarray(ids[:num_ids], np.int32)


def mix_rows(text_rows: grain.IterDataset, fraction: float, rows: RecallRows, *, shard_index: int,
             shard_count: int, read: grain.ReadOptions) -> grain.IterDataset:
  """`text_rows` with a `fraction` of synthetic `rows` interleaved: this process reads the
  `shard_index`-th of `shard_count` equal contiguous blocks of them (a block, not every
  shard_count-th row, so that the kinds still take turns within each process)."""
  block = len(rows) // shard_count
  synthetic = grain.MapDataset.source(rows)[shard_index * block:(shard_index + 1) * block]
  synthetic = synthetic.to_iter_dataset(read)
  return grain.IterDataset.mix([text_rows, synthetic], [1.0 - fraction, fraction])
