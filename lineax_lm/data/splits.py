"""A held-out split of any document source, by a hash of the document index.

`heldout_indices(n, fraction)` keeps the indices whose crc32 falls in the lowest `fraction`: the
same documents for any source size that contains them (prefix-stable) and independent of order.
`SplitSource(source, fraction, "train" | "heldout")` is the complement or that part, as a
random-access source, so training (`config.data.split="train"`) never reads a held-out document and
the evaluation (`split="heldout"`) reads only those.
"""
from __future__ import annotations

import zlib

import numpy as np

SPLITS = ("train", "heldout")


def heldout_indices(num_documents: int, fraction: float, salt: int = 0) -> list[int]:
  """The indices i in [0, num_documents) with crc32(i, salt) in the lowest `fraction` (about
  fraction * num_documents of them, the same ones for any size that contains them)."""
  if not 0 < fraction <= 1:
    raise ValueError(f"`fraction` must be in (0, 1]; got {fraction}")
  cut = int(fraction * 2**32)
  return [i for i in range(num_documents) if zlib.crc32(f"{salt}:{i}".encode()) < cut]


class SplitSource:
  """The documents of `source` in split `split` ("heldout": the `heldout_indices` of `fraction`,
  "train": the others)."""

  def __init__(self, source, fraction: float, split: str, salt: int = 0):
    if split not in SPLITS:
      raise ValueError(f"`data.split` must be one of {SPLITS}; got {split!r}")
    held = heldout_indices(len(source), fraction, salt)
    if split == "heldout":
      keep = np.asarray(held, np.int64)
    else:
      mask = np.ones(len(source), bool)
      mask[held] = False
      keep = np.flatnonzero(mask)
    if not len(keep):
      raise ValueError(f"`data.heldout_fraction`={fraction} leaves no {split} document of the "
                       f"{len(source)} in {source!r}")
    self.source, self.split, self.fraction, self._keep = source, split, fraction, keep

  def __len__(self) -> int:
    return len(self._keep)

  def __getitem__(self, index: int):
    return self.source[int(self._keep[int(index)])]

  def __repr__(self) -> str:
    return f"SplitSource({self.source!r}, {self.split}, heldout_fraction={self.fraction}, {len(self)} documents)"
