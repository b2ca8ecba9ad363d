"""GGUF dequantisation on hand-built blocks, and the q/k row permutation of llama.cpp.

Each oracle below decodes one block straight from ggml's block layout (ggml-quants.c
dequantize_row_*), independently of the `gguf` package whose dequantiser the loader uses.
"""
import numpy as np
import pytest

from lineax_lm.distill import gguf_file

RNG_SEED = 0


def _f16(x):
  return np.float16(x).astype(np.float32)


def _q8_0(b):
  d = b[:2].view(np.float16)[0].astype(np.float32)
  return d * b[2:34].view(np.int8).astype(np.float32)


def _q4_0(b):
  d, qs = _f16(b[:2].view(np.float16)[0]), b[2:18].astype(np.int32)
  return np.concatenate([(qs & 15) - 8, (qs >> 4) - 8]).astype(np.float32) * d


def _q4_1(b):
  d, m, qs = _f16(b[:2].view(np.float16)[0]), _f16(b[2:4].view(np.float16)[0]), b[4:20]
  return np.concatenate([qs & 15, qs >> 4]).astype(np.float32) * d + m


def _q5(b, with_min):
  d = _f16(b[:2].view(np.float16)[0])
  m = _f16(b[2:4].view(np.float16)[0]) if with_min else 0.0
  o = 4 if with_min else 2
  qh = int(b[o:o + 4].view(np.uint32)[0])
  qs = b[o + 4:o + 20].astype(np.int64)
  hi = np.array([(qh >> j) & 1 for j in range(32)], np.int64) << 4
  q = np.concatenate([qs & 15, qs >> 4]) | hi
  return (q - (0 if with_min else 16)).astype(np.float32) * d + m


def _q4_k(b):
  d, dmin = _f16(b[:2].view(np.float16)[0]), _f16(b[2:4].view(np.float16)[0])
  s, qs = b[4:16].astype(np.int64), b[16:144].astype(np.int64)

  def scale_min(j):
    if j < 4:
      return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)

  out = []
  for g in range(4):
    q = qs[32 * g:32 * g + 32]
    for half, nib in ((0, q & 15), (1, q >> 4)):
      sc, mn = scale_min(2 * g + half)
      out.append(d * sc * nib - dmin * mn)
  return np.concatenate(out).astype(np.float32)


def _q6_k(b):
  ql, qh = b[:128].astype(np.int64), b[128:192].astype(np.int64)
  sc, d = b[192:208].view(np.int8).astype(np.float32), _f16(b[208:210].view(np.float16)[0])
  y = np.zeros(256, np.float32)
  for n in range(2):
    l_, h_, s_ = ql[64 * n:], qh[32 * n:], sc[8 * n:]
    for l in range(32):
      i = l // 16
      qv = [((l_[l] & 15) | (((h_[l] >> 0) & 3) << 4)) - 32,
            ((l_[l + 32] & 15) | (((h_[l] >> 2) & 3) << 4)) - 32,
            ((l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4)) - 32,
            ((l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4)) - 32]
      for k in range(4):
        y[128 * n + l + 32 * k] = d * s_[i + 2 * k] * qv[k]
  return y


# type name -> (bytes per block, scale field offsets (f16) to make finite, oracle)
_TYPES = {
    "Q8_0": (34, (0,), _q8_0),
    "Q4_0": (18, (0,), _q4_0),
    "Q4_1": (20, (0, 2), _q4_1),
    "Q5_0": (22, (0,), lambda b: _q5(b, False)),
    "Q5_1": (24, (0, 2), lambda b: _q5(b, True)),
    "Q4_K": (144, (0, 2), _q4_k),
    "Q6_K": (210, (208,), _q6_k),
}


@pytest.mark.parametrize("qtype", sorted(_TYPES))
def test_dequantize_matches_ggml_block_layout(qtype):
  """Random blocks (random quants, finite f16 scales), 2 rows x 3 blocks, against the oracle."""
  size, scale_offsets, oracle = _TYPES[qtype]
  rng = np.random.default_rng(RNG_SEED)
  blocks = rng.integers(0, 256, size=(6, size), dtype=np.uint8)
  for o in scale_offsets:
    blocks[:, o:o + 2] = rng.uniform(-0.1, 0.1, size=(6, 1)).astype(np.float16).view(np.uint8)
  data = blocks.reshape(2, 3 * size)
  got = gguf_file.dequantize(data, qtype)
  want = np.stack([np.concatenate([oracle(b) for b in row.reshape(3, size)]) for row in data])
  assert got.dtype == np.float32 and got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_dequantize_float_types():
  x = np.array([[1.5, -2.25, 0.375, 65504.0]], np.float32)  # exact in f16
  np.testing.assert_array_equal(gguf_file.dequantize(x, "F32"), x)
  np.testing.assert_array_equal(gguf_file.dequantize(x.astype(np.float16), "F16"), x)
  bf16 = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(1, 8)
  want = ((x.view(np.uint32) >> 16) << 16).view(np.float32)
  np.testing.assert_array_equal(gguf_file.dequantize(bf16, "BF16"), want)


def test_dequantize_rejects_unknown_type():
  with pytest.raises(ValueError, match="qtype"):
    gguf_file.dequantize(np.zeros((1, 34), np.uint8), "Q9_9")


def _rope_half(x, pos, base=10000.0):
  """Hugging Face rotary (rotate_half): pairs (j, j + d/2) of each head row block."""
  d = x.shape[-1]
  ang = pos * base ** (-np.arange(d // 2) * 2.0 / d)
  a, b = x[..., :d // 2], x[..., d // 2:]
  return np.concatenate([a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1)


def _rope_interleaved(x, pos, base=10000.0):
  """ggml's normal rotary: pairs (2j, 2j + 1)."""
  d = x.shape[-1]
  ang = pos * base ** (-np.arange(d // 2) * 2.0 / d)
  a, b = x[..., 0::2], x[..., 1::2]
  out = np.empty_like(x)
  out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
  out[..., 1::2] = b * np.cos(ang) + a * np.sin(ang)
  return out


@pytest.mark.parametrize("n_heads,head_dim", [(3, 8), (1, 64), (4, 2)])
def test_qk_permutation_round_trip_and_rotary_equivalence(n_heads, head_dim):
  rng = np.random.default_rng(RNG_SEED)
  w = rng.standard_normal((n_heads * head_dim, 5)).astype(np.float32)
  p = gguf_file.permute_qk(w, n_heads)
  np.testing.assert_array_equal(gguf_file.unpermute_qk(p, n_heads), w)
  assert not np.array_equal(p, w) or head_dim == 2
  # The point of the permutation: HF weights + rotate_half == permuted weights + interleaved rope.
  x = rng.standard_normal(5)
  hf = _rope_half((w @ x).reshape(n_heads, head_dim), pos=7.0)
  gg = _rope_interleaved((p @ x).reshape(n_heads, head_dim), pos=7.0)
  np.testing.assert_allclose(gguf_file.permute_qk(hf.reshape(-1), n_heads), gg.reshape(-1),
                             rtol=1e-5, atol=1e-6)


def test_qk_permutation_rejects_bad_heads():
  with pytest.raises(ValueError, match="n_heads"):
    gguf_file.unpermute_qk(np.zeros((12, 4)), 5)


def test_hf_names():
  assert gguf_file.hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
  assert gguf_file.hf_name("token_embd.weight") == "model.embed_tokens.weight"
  assert gguf_file.hf_name("output.weight") == "lm_head.weight"
  with pytest.raises(ValueError, match="rope_freqs"):
    gguf_file.hf_name("rope_freqs.weight")
