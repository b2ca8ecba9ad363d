"""The library surface: top-level names, prompts of different lengths in one batch (each row's
tokens are the greedy continuation of its own prompt; lengths within a bucket share one program),
and save_pretrained / from_pretrained in the Hugging Face layout."""
import json

import jax
import numpy as np
import pytest
from flax import nnx

import lineax_lm
import pallas_kernels
from lineax_lm.data.tokenizer import ByteTokenizer
from lineax_lm.models import generate as generation
from lineax_lm.models.hybrid import HybridLM
from tests.lineax_lm.tiny import tiny_config, tokens


@pytest.fixture(scope="module")
def model():
  # attention and a linear mixer: the attention layer checks positions, the linear one the state
  return HybridLM(tiny_config("gated_deltanet", vocab_size=259, attn_ratio="1:1"), nnx.Rngs(0))


def test_top_level_names():
  assert lineax_lm.HybridLM is HybridLM
  assert lineax_lm.generate is generation.generate
  for name in ("ModelConfig", "load", "from_pretrained", "save_pretrained", "GatedDeltaNet",
               "Attention", "RMSNorm", "mixer_config"):
    assert getattr(lineax_lm, name) is not None
  assert lineax_lm.__version__ == pallas_kernels.__version__
  assert callable(pallas_kernels.chunk_gla)
  with pytest.raises(AttributeError, match="no attribute 'nope'"):
    lineax_lm.nope


@nnx.jit
def _forward(model, x):
  return model(x)


def test_prompts_of_different_lengths_generate_in_one_batch(model):
  prompts = [tokens((11,), 259, seed=1).tolist(), tokens((9,), 259, seed=2).tolist(),
             tokens((14,), 259, seed=3).tolist()]
  compiled = generation._generate_ragged._cache_size()
  new = lineax_lm.generate_ragged(model, prompts, 3, temperature=0.0)
  # one more batch of other lengths in the same bucket (padded width 16): no compile
  again = lineax_lm.generate_ragged(model, [prompts[2], prompts[0], prompts[0][:10]], 3, temperature=0.0)
  assert generation._generate_ragged._cache_size() == compiled + 1
  assert again[:2] == [new[2], new[0]]
  # every row is the greedy continuation of its own prompt: a plain forward pass over prompt +
  # generated tokens (padded at the end: causal) picks each generated token
  x = np.zeros((3, 17), np.int32)
  for row, (p, g) in enumerate(zip(prompts, new)):
    assert len(g) == 3
    x[row, :len(p) + 3] = p + g
  logits = np.asarray(_forward(model, x))
  for row, p in enumerate(prompts):
    assert logits[row, len(p) - 1:len(p) + 2].argmax(-1).tolist() == new[row]
  with pytest.raises(ValueError, match="generate_ragged"):
    lineax_lm.generate(model, prompts, 3, temperature=0.0)
  with pytest.raises(ValueError, match="length >= 1"):
    lineax_lm.generate_ragged(model, [[1], []], 3, temperature=0.0)


def test_generate_is_greedy_by_default_and_compiles_per_length_bucket(model):
  prompt = tokens((2, 9), 259, seed=4)
  greedy = np.asarray(lineax_lm.generate(model, prompt, 3))  # no rng: greedy, as in HF
  np.testing.assert_array_equal(greedy, lineax_lm.generate(model, prompt, 3, temperature=0.0))
  assert lineax_lm.generate_ragged(model, prompt.tolist(), 3) == greedy[:, 9:].tolist()
  compiled = generation._generate_ragged._cache_size()
  for length in (10, 11, 12):  # the bucket of 9: padded to 16
    lineax_lm.generate(model, tokens((2, length), 259, seed=length), 3)
  assert generation._generate_ragged._cache_size() == compiled


def test_save_pretrained_round_trip(model, tmp_path):
  folder = lineax_lm.save_pretrained(model, tmp_path / "m", tokenizer=ByteTokenizer())
  meta = json.loads((tmp_path / "m" / "config.json").read_text())
  assert meta["model_type"] == "lineax_hybrid" and meta["tokenizer"]["kind"] == "byte"
  assert (tmp_path / "m" / "model.safetensors").stat().st_size > 0
  loaded = lineax_lm.load(folder)
  assert loaded.model.config == model.config and isinstance(loaded.tokenizer, ByteTokenizer)
  want, got = nnx.state(model, nnx.Param), nnx.state(loaded.model, nnx.Param)
  assert jax.tree.structure(want) == jax.tree.structure(got)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert isinstance(lineax_lm.from_pretrained(folder), HybridLM)
  meta["hidden"] = 48
  (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="has shape"):
    lineax_lm.load(folder)
  with pytest.raises(FileNotFoundError, match="neither"):
    lineax_lm.load(tmp_path / "empty")
