"""Packing: every next-token pair of every document lands in exactly one row, once, with consistent
segment ids and positions; cu_seqlens from segment ids."""
import grain
import jax
import numpy as np
import pytest

from lineax_lm.data.packing import pack, segment_ids_to_cu_seqlens

PAD = 999_999


def documents(seed=0, n=40):
  """Doc d, token j has the id d * 1000 + j, so every pair names its document and offset."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, 40, size=n)
  return [np.arange(len_, dtype=np.int32) + 1000 * d for d, len_ in enumerate(lengths)]


def rows_of(mode, seq_len, docs, bins=4):
  ds = grain.MapDataset.source(docs).to_iter_dataset()
  return list(pack(ds, mode=mode, seq_len=seq_len, pad_id=PAD, num_packing_bins=bins, seed=1))


@pytest.mark.parametrize("mode", ["concat", "first_fit", "none"])
@pytest.mark.parametrize("seq_len", [8, 13])
def test_every_pair_once(mode, seq_len):
  docs = documents()
  expected = sorted((int(a), int(b)) for d in docs for a, b in zip(d[:-1], d[1:]))
  rows = rows_of(mode, seq_len, docs)
  got, pads = [], 0
  for row in rows:
    keys = {"inputs", "targets", "loss_mask"} | ({"segment_ids", "positions"} if mode != "none" else set())
    assert set(row) == keys
    for x in row.values():
      assert x.shape == (seq_len,) and x.dtype == np.int32
    m = row["loss_mask"].astype(bool)
    got += list(zip(row["inputs"][m].tolist(), row["targets"][m].tolist()))
    assert np.all(row["targets"][m] == row["inputs"][m] + 1)  # pairs are next tokens of one doc
    assert np.all(row["inputs"][~m] == PAD) and np.all(row["targets"][~m] == PAD)
    pads += int((~m).sum())
    if mode == "none":
      assert m[0] and np.all(np.diff(m.astype(int)) <= 0)  # one piece, then padding
      assert row["inputs"][0] % 1000 % seq_len == 0  # pieces start at multiples of seq_len
      continue
    seg, pos = row["segment_ids"], row["positions"]
    np.testing.assert_array_equal(seg > 0, m)
    for s in np.unique(seg[seg > 0]):
      idx = np.flatnonzero(seg == s)
      assert np.all(np.diff(idx) == 1)  # contiguous
      np.testing.assert_array_equal(pos[idx], np.arange(len(idx)))
      offsets = row["inputs"][idx] % 1000
      assert len(set((row["inputs"][idx] // 1000).tolist())) == 1  # one document per segment
      np.testing.assert_array_equal(np.diff(offsets), 1)
      if mode == "first_fit":
        assert offsets[0] % seq_len == 0  # whole pieces, never split
  assert sorted(got) == expected
  if mode == "concat":
    assert pads < seq_len  # only the last row is padded
  if mode == "first_fit":
    assert len(rows) < sum(-(-(len(d) - 1) // seq_len) for d in docs if len(d) > 1)  # it packed


def test_bad_mode():
  ds = grain.MapDataset.source(documents()).to_iter_dataset()
  with pytest.raises(ValueError, match="packing"):
    pack(ds, mode="greedy", seq_len=8, pad_id=0)


def test_cu_seqlens():
  seg = np.array([[1, 1, 2, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
  cu = segment_ids_to_cu_seqlens(seg)
  assert cu.dtype == np.int32
  np.testing.assert_array_equal(cu, [0, 2, 5, 6, 8, 16])
  np.testing.assert_array_equal(segment_ids_to_cu_seqlens(seg[0]), [0, 2, 5, 6, 8])
  # a row starting with the id the previous row ended with is still a new sequence
  np.testing.assert_array_equal(segment_ids_to_cu_seqlens(np.array([[1, 1], [1, 2]])), [0, 2, 3, 4])
  fixed = jax.jit(lambda s: segment_ids_to_cu_seqlens(s, max_segments=8))(seg)
  np.testing.assert_array_equal(fixed, [0, 2, 5, 6, 8, 16, 16, 16, 16])
  with pytest.raises(ValueError, match="max_segments"):
    segment_ids_to_cu_seqlens(seg, max_segments=4)
  with pytest.raises(ValueError, match="segment_ids"):
    segment_ids_to_cu_seqlens(np.zeros((1, 2, 3)))
