"""Multi-query associative recall (MQAR), the Zoology definition (Arora et al., 2023).

An example of length L over a vocabulary of V tokens, with n key-value pairs:

  inputs   k1 v1 k2 v2 ... kn vn | x x q x x x q x ... x        (L tokens)
  targets  -  -  -  -  ... -  -  | - - v - - - v - ... -        (loss_mask 1 only under "v")

- keys are drawn without replacement from the lower half of the vocabulary, [1, V // 2) (token 0 is
  reserved as Zoology's filler); values without replacement from the upper half, [V // 2, V);
- the first 2n positions hold the pairs (key, value, key, value, ...);
- the rest is the query region: every key is queried once, at even offsets 2 * gap from its start,
  where the n distinct gaps are drawn from {0, ..., (L - 2n) // 2 - 1} with a power law,
  P(gap = j) proportional to a * (j + 1) ** (a - 1) (`power_a` = a; small a favours short gaps);
- `targets` at a query position is the value paired with the queried key (the model must emit it
  after reading the key) and `loss_mask` is 1 there and only there; elsewhere `targets` is 0 (a
  valid id, so an unmasked cross-entropy never indexes out of range) and `loss_mask` is 0;
- the other positions of the query region are uniform random tokens from [0, V)
  (`random_non_queries=True`, Zoology's default) or 0.

Each example is a pure function of (seed, index) (`np.random.default_rng((seed, index))`),
so any example can be regenerated and a dataset of any length costs no memory; examples are not
bit-identical to Zoology's (which draws all examples from one global RNG stream) but follow the
same distribution. `MQARSource` is a grain random-access data source:

  src = MQARSource(vocab_size=8192, seq_len=256, num_kv_pairs=16, seed=0)
  ex = src[3]               # {"inputs": [L] int32, "targets": [L] int32, "loss_mask": [L] int32}
  batch = src.batch(range(64))           # same keys, stacked to [64, L]
  ds = grain.MapDataset.source(src)      # how lineax_lm.data.pipeline uses it

Evaluation draws its test set from a different seed than training (Zoology: 100k train, 3k test).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np


@dataclasses.dataclass(frozen=True)
class MQARSource:
  """Random-access MQAR dataset (grain `RandomAccessDataSource`): `src[i]` is example i.

  Attributes:
    vocab_size: V; keys from [1, V // 2), values from [V // 2, V).
    seq_len: L, the length of `inputs` / `targets` / `loss_mask`.
    num_kv_pairs: n, the number of key-value pairs (and of queries); 4 * n <= L.
    power_a: a > 0 of the power-law gap distribution (Zoology default 0.01).
    num_examples: len(src); any index in [0, num_examples) is valid.
    seed: non-negative int; examples are a pure function of (seed, index).
    random_non_queries: fill non-query positions of the query region with random tokens (else 0).
  """
  vocab_size: int = 8192
  seq_len: int = 256
  num_kv_pairs: int = 8
  power_a: float = 0.01
  num_examples: int = 100_000
  seed: int = 0
  random_non_queries: bool = True

  def __post_init__(self):
    for name in ("vocab_size", "seq_len", "num_kv_pairs", "num_examples", "seed"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"MQAR `{name}` must be an int; got {value!r}")
    if self.num_kv_pairs < 1:
      raise ValueError(f"MQAR `num_kv_pairs` must be >= 1; got {self.num_kv_pairs}")
    if self.vocab_size // 2 - 1 < self.num_kv_pairs:
      raise ValueError(f"MQAR `vocab_size` = {self.vocab_size} is too small for {self.num_kv_pairs} "
                       f"distinct keys in [1, vocab_size // 2); need vocab_size >= "
                       f"{2 * self.num_kv_pairs + 2}")
    if self.seq_len < 4 * self.num_kv_pairs:
      raise ValueError(f"MQAR `seq_len` = {self.seq_len} must be >= 4 * num_kv_pairs = "
                       f"{4 * self.num_kv_pairs} (the pairs, then a query region with room for "
                       "every query)")
    if not self.power_a > 0:
      raise ValueError(f"MQAR `power_a` must be > 0; got {self.power_a}")
    if self.num_examples < 1 or self.seed < 0:
      raise ValueError(f"MQAR `num_examples` must be >= 1 and `seed` >= 0; got "
                       f"{self.num_examples} and {self.seed}")

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    """Example `index` as {"inputs", "targets", "loss_mask"}: [L] int32 arrays each."""
    index = int(index)
    if not 0 <= index < self.num_examples:
      raise IndexError(f"MQAR index {index} is outside [0, {self.num_examples})")
    return mqar_example(index, seed=self.seed, vocab_size=self.vocab_size, seq_len=self.seq_len,
                        num_kv_pairs=self.num_kv_pairs, power_a=self.power_a,
                        random_non_queries=self.random_non_queries)

  def batch(self, indices: Iterable[int]) -> dict[str, np.ndarray]:
    """Examples `indices` stacked: {"inputs", "targets", "loss_mask"}, [N, L] int32 each."""
    examples = [self[i] for i in indices]
    return {k: np.stack([e[k] for e in examples]) for k in ("inputs", "targets", "loss_mask")}


def gap_probabilities(space: int, power_a: float) -> np.ndarray:
  """P(gap = j), j in [0, space): a * (j + 1) ** (a - 1), normalised (Zoology's power law)."""
  p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
  return p / p.sum()


def mqar_example(index: int, *, seed: int, vocab_size: int, seq_len: int, num_kv_pairs: int,
                 power_a: float, random_non_queries: bool = True) -> dict[str, np.ndarray]:
  """One MQAR example, a pure function of (seed, index); arguments as in `MQARSource` (which
  validates them). Returns {"inputs", "targets", "loss_mask"}, [seq_len] int32 each."""
  rng = np.random.default_rng((seed, index))
  n, L = num_kv_pairs, seq_len
  half = vocab_size // 2
  keys = rng.choice(np.arange(1, half), size=n, replace=False)
  values = rng.choice(np.arange(half, vocab_size), size=n, replace=False)
  context = 2 * n
  space = (L - context) // 2
  gaps = rng.choice(space, size=n, replace=False, p=gap_probabilities(space, power_a))

  inputs = np.zeros(L, np.int32)
  inputs[0:context:2] = keys
  inputs[1:context:2] = values
  query_pos = context + 2 * gaps
  inputs[query_pos] = keys
  if random_non_queries:
    filler = rng.integers(0, vocab_size, size=L, dtype=np.int32)
    fill = np.ones(L, bool)
    fill[:context] = False
    fill[query_pos] = False
    inputs[fill] = filler[fill]
  targets = np.zeros(L, np.int32)
  targets[query_pos] = values
  loss_mask = np.zeros(L, np.int32)
  loss_mask[query_pos] = 1
  return {"inputs": inputs, "targets": targets, "loss_mask": loss_mask}
