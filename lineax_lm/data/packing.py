"""Language-model examples and sequence packing, on grain's packers.

A tokenized document of n ids gives n - 1 next-token pairs: `inputs = ids[:-1]`,
`targets = ids[1:]`, `loss_mask = 1`. `pack` turns a stream of documents into rows of exactly
`seq_len` tokens, in one of three modes:

- "concat": grain's `ConcatThenSplitIterDataset`: documents are concatenated and cut every seq_len
  tokens (no padding; a document cut at a row end continues as a new segment of the next row).
- "first_fit": documents are cut into pieces of at most seq_len pairs, then grain's
  `FirstFitPackIterDataset` places whole pieces into rows (no piece is split; the rest is padding).
- "none": one piece per row, padded (no `segment_ids` / `positions`).

Packed rows carry `segment_ids` (1, 2, ... per piece in the row, 0 on padding) and `positions`
(0, 1, ... within each piece). Padding has `inputs = targets = pad_id` and `loss_mask = 0`.

`max_segments` bounds the sequences of a packed row as the model counts them (`models.hybrid`:
every piece, and a padding tail as one more), because a model run under jit holds a static number
of sequences per row and turns the logits of a row with more into NaN. "concat" gives a row of more
pieces than that as several rows of max_segments - 1 pieces and a padding tail each (the pieces
and their order unchanged); "first_fit" closes a bin at max_segments - 1 pieces. A row that still
holds more (max_segments = 1 and a padded row) is a ValueError naming `max_segments`.
`segment_ids_to_cu_seqlens` turns the segment ids of packed rows into the `cu_seqlens` offsets the
varlen (B == 1) kernels take.
"""
from __future__ import annotations

import grain
import jax.numpy as jnp
import numpy as np

PACKING_MODES = ("concat", "first_fit", "none")
_FEATURES = ("inputs", "targets", "loss_mask")


def lm_example(ids: np.ndarray) -> dict[str, np.ndarray]:
  """[n] ids -> {"inputs": ids[:-1], "targets": ids[1:], "loss_mask": ones}, [n - 1] int32 each."""
  ids = np.asarray(ids, np.int32)
  return {"inputs": ids[:-1], "targets": ids[1:], "loss_mask": np.ones(len(ids) - 1, np.int32)}


class SplitDocument(grain.experimental.FlatMapTransform):
  """[n] ids -> LM examples of at most `seq_len` pairs each (pieces of seq_len + 1 ids that overlap
  by one id, so every next-token pair of the document is in exactly one piece)."""

  max_fan_out = 1 << 20  # only bounds grain's MapDataset flat map; the iterator version ignores it

  def __init__(self, seq_len: int):
    self.seq_len = seq_len

  def flat_map(self, ids: np.ndarray) -> list[dict[str, np.ndarray]]:
    L = self.seq_len
    return [lm_example(ids[s:s + L + 1]) for s in range(0, len(ids) - 1, L)]


def pad_example(example: dict[str, np.ndarray], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  """Pads an LM example of length <= seq_len to seq_len (pad_id; loss_mask 0)."""
  out = {}
  for k in _FEATURES:
    x = example[k]
    out[k] = np.pad(x, (0, seq_len - len(x)), constant_values=0 if k == "loss_mask" else pad_id)
  return out


def _packed_row(row: dict[str, np.ndarray], pad_id: int) -> dict[str, np.ndarray]:
  """grain's packed features -> ours; padding (segment id 0) gets pad_id (grain pads with 0)."""
  segment_ids = row["inputs_segment_ids"].astype(np.int32)
  pad = segment_ids == 0
  out = {k: np.where(pad, pad_id, row[k]).astype(np.int32) for k in ("inputs", "targets")}
  out["loss_mask"] = np.where(pad, 0, row["loss_mask"]).astype(np.int32)
  out["segment_ids"] = segment_ids
  out["positions"] = row["inputs_positions"].astype(np.int32)
  return out


def _sequence_starts(segment_ids: np.ndarray) -> np.ndarray:
  """Where the sequences of one packed row start, as the model counts them (a padding tail too)."""
  return np.flatnonzero(np.concatenate([[True], segment_ids[1:] != segment_ids[:-1]]))


class SplitCrowdedRow(grain.experimental.FlatMapTransform):
  """A packed row of more than `max_segments` sequences -> rows of max_segments - 1 of its pieces
  each, moved to the row start and followed by padding (which the model counts as one more
  sequence); other rows pass unchanged."""

  max_fan_out = 1 << 20  # only bounds grain's MapDataset flat map; the iterator version ignores it

  def __init__(self, max_segments: int, pad_id: int):
    self.max_segments, self.pad_id = max_segments, pad_id

  def flat_map(self, row: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    seg = row["segment_ids"]
    starts = _sequence_starts(seg)
    if len(starts) <= self.max_segments or self.max_segments < 2:  # < 2: `check_segments` says why
      return [row]
    pieces = [(a, b) for a, b in zip(starts, list(starts[1:]) + [len(seg)]) if seg[a] != 0]
    per_row = self.max_segments - 1
    out = []
    for first in range(0, len(pieces), per_row):
      group = pieces[first:first + per_row]
      idx = np.concatenate([np.arange(a, b) for a, b in group])
      new = {k: np.full_like(v, self.pad_id if k in ("inputs", "targets") else 0)
             for k, v in row.items()}
      for k, v in row.items():
        new[k][:len(idx)] = v[idx]
      new["segment_ids"][:len(idx)] = np.repeat(np.arange(1, len(group) + 1, dtype=np.int32),
                                                [b - a for a, b in group])
      out.append(new)
    return out


def check_segments(row: dict[str, np.ndarray], max_segments: int) -> dict[str, np.ndarray]:
  """`row` unchanged, or a ValueError if it holds more sequences than `max_segments`."""
  n = len(_sequence_starts(row["segment_ids"]))
  if n > max_segments:
    raise ValueError(
        f"a packed row holds {n} sequences (documents, and its padding tail as one), more than "
        f"`max_segments` = {max_segments}, the number a model holds per row under jit (more turn "
        "the loss into NaN); raise config.data.max_segments and config.model.max_segments together "
        "(a padded row needs at least 2), or use packing='none'")
  return row


def pack(ds: grain.IterDataset, *, mode: str, seq_len: int, pad_id: int, num_packing_bins: int = 16,
         seed: int = 0, max_segments: int | None = None) -> grain.IterDataset:
  """Documents ([n] int32 ids each) -> rows {"inputs", "targets", "loss_mask"[, "segment_ids",
  "positions"]}, [seq_len] int32 each (see the module docstring for the modes). Documents of fewer
  than 2 ids hold no pair and are skipped. `num_packing_bins` and `seed` (the shuffle of finished
  bins) apply to "first_fit"; `max_segments` (None: no bound) to "concat" and "first_fit"."""
  if mode not in PACKING_MODES:
    raise ValueError(f"`packing` must be one of {PACKING_MODES}; got {mode!r}")
  if seq_len < 1:
    raise ValueError(f"`seq_len` must be >= 1; got {seq_len}")
  if max_segments is not None and max_segments < 1:
    raise ValueError(f"`max_segments` must be >= 1 or None; got {max_segments}")
  ds = ds.filter(lambda ids: len(ids) >= 2)
  lengths = {k: seq_len for k in _FEATURES}
  if mode == "concat":
    ds = grain.experimental.ConcatThenSplitIterDataset(ds.map(lm_example), length_struct=lengths)
    ds = ds.map(lambda row: _packed_row(row, pad_id))
    if max_segments is not None:
      ds = grain.experimental.FlatMapIterDataset(ds, SplitCrowdedRow(max_segments, pad_id))
  else:
    ds = grain.experimental.FlatMapIterDataset(ds, SplitDocument(seq_len))
    if mode == "none":
      return ds.map(lambda ex: pad_example(ex, seq_len, pad_id))
    if num_packing_bins < 1:
      raise ValueError(f"`num_packing_bins` must be >= 1; got {num_packing_bins}")
    ds = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct=lengths, num_packing_bins=num_packing_bins, seed=seed, shuffle_bins=True,
        max_sequences_per_bin=None if max_segments is None else max(1, max_segments - 1))
    ds = ds.map(lambda row: _packed_row(row, pad_id))
  return ds if max_segments is None else ds.map(lambda row: check_segments(row, max_segments))


def segment_ids_to_cu_seqlens(segment_ids, max_segments: int | None = None):
  """Segment ids of packed rows -> FlashAttention-style `cu_seqlens` for B == 1 kernels.

  Args:
    segment_ids: [L] or [B, L] ints (one packed row, or B rows flattened row-major into one sequence
      of T = B * L tokens). A new segment starts at every change of id and at every row start; a
      padding tail (id 0) counts as a segment of its own, so the offsets always end at T.
    max_segments: None: a numpy int32 array [N + 1] with the exact N. An int: a fixed-size
      [max_segments + 1] int32 jax array, padded by repeating T (empty segments), which works under
      `jax.jit`; a concrete input with more than max_segments segments raises ValueError.
  Returns:
    cu_seqlens: int32 offsets [0, ..., T].
  """
  if getattr(segment_ids, "ndim", 0) not in (1, 2):
    raise ValueError("`segment_ids` must have shape [L] or [B, L]; got "
                     f"{getattr(segment_ids, 'shape', type(segment_ids).__name__)}")
  xp = np if max_segments is None else jnp
  L = segment_ids.shape[-1]
  seg = xp.reshape(segment_ids, (-1,))
  T = seg.shape[0]
  t = xp.arange(T)
  starts = (t % L == 0) | (seg != xp.roll(seg, 1))
  if max_segments is None:
    return np.append(np.flatnonzero(starts), T).astype(np.int32)
  if max_segments < 1:
    raise ValueError(f"`max_segments` must be >= 1; got {max_segments}")
  if isinstance(segment_ids, np.ndarray) and int(np.count_nonzero(starts)) > max_segments:
    raise ValueError(f"`max_segments` = {max_segments} is less than the {int(np.count_nonzero(starts))} "
                     "segments of `segment_ids`")
  offsets = jnp.nonzero(starts, size=max_segments, fill_value=T)[0]
  return jnp.append(offsets, T).astype(jnp.int32)
