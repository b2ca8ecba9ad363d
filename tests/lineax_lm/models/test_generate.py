"""The work of generation's compiled program: the prefill forms only the logits it samples from, its
attention is causal within the prompt (not masked over the whole cache) and holds the scores of one
chunk of query rows at a time, the decode loop runs the model only on tokens whose successor it
still has to pick, and prompt lengths of one width bucket share the program and give each row its
own prompt's continuation."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lineax_lm.layers import attention
from lineax_lm.models import generate as generation
from lineax_lm.models.hybrid import HybridLM
from tests.lineax_lm.tiny import tiny_config, tokens

VOCAB = 97  # a size no other dimension of the tiny model has, to find its logits in the HLO


def _program(model, prompts, max_new_tokens):
  """_generate_ragged's arguments for equal-length `prompts` [B, P], not padded."""
  B, P = prompts.shape
  buffer = np.zeros((B, P + max_new_tokens), np.int32)
  buffer[:, :P] = prompts
  return (model, jnp.asarray(buffer), jnp.full((B,), P, jnp.int32), jax.random.key(0)), dict(
      max_new_tokens=max_new_tokens, temperature=0.0, top_k=None, top_p=None, eos_id=None)


def test_prefill_forms_the_last_logits_only():
  model = HybridLM(tiny_config(vocab_size=VOCAB, attn_ratio="1:1"), nnx.Rngs(0))
  x = jnp.asarray(tokens((2, 16), VOCAB))
  full, _ = model.step(x, model.init_cache(2, 16))
  last, cache = model.step(x, model.init_cache(2, 16), last_only=True)
  assert last.shape == (2, 1, VOCAB) and int(cache["pos"]) == 16
  np.testing.assert_allclose(last, full[:, -1:], rtol=1e-6, atol=1e-6)
  args, static = _program(model, tokens((2, 16), VOCAB), 4)
  hlo = generation._generate_ragged.lower(*args, **static).compile().as_text()
  assert re.search(rf"f32\[2,(1,)?{VOCAB}\]", hlo)  # one position's logits, as the loop forms them
  assert f"f32[2,16,{VOCAB}]" not in hlo, "the program forms the logits of every prompt position"


def test_the_last_token_is_never_read():
  model = HybridLM(tiny_config(vocab_size=VOCAB), nnx.Rngs(0))
  prompts = tokens((2, 8), VOCAB)
  for new in (1, 5):
    args, static = _program(model, prompts, new)
    out, read = generation._generate_ragged(*args, **static)
    assert int(read) == 8 + new - 1  # the prompt and every generated token but the last
    np.testing.assert_array_equal(out, generation.generate(model, prompts, new))


def test_a_prompt_into_a_fresh_cache_attends_within_itself():
  """`step(fresh=True)`: the same logits and cache as attending over every slot of the cache, and
  no [P, S] score tensor over the cache's S slots in the program."""
  model = HybridLM(tiny_config(vocab_size=VOCAB, attn_ratio="1:1", window=5), nnx.Rngs(0))
  x = jnp.asarray(tokens((2, 16), VOCAB))
  over_cache = model.step(x, model.init_cache(2, 48))
  fresh = model.step(x, model.init_cache(2, 48), fresh=True)
  for a, b in zip(jax.tree_util.tree_leaves(over_cache), jax.tree_util.tree_leaves(fresh)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  hlo = jax.jit(lambda m, x, c: m.step(x, c, fresh=True)).lower(model, x, model.init_cache(2, 48)).as_text()
  assert not re.search(r"x16x48x", hlo), "the prompt's scores span the cache's 48 slots"


def test_prefill_attention_holds_one_chunk_of_scores_at_a_time(monkeypatch):
  """On the XLA path a prompt's attention runs over chunks of query rows: generation's compiled
  program holds less than one [B, H, P, P] float32 score tensor (one call over the whole prompt
  holds three such buffers: the scores, their exponentials, the probabilities), and the chunks give
  the logits and cache of one call (a window and GQA included)."""
  B, P, H = 4, 512, 4
  scores = B * H * P * P * 4
  model = HybridLM(tiny_config(vocab_size=VOCAB, attn_ratio="transformer", num_layers=1, window=300),
                   nnx.Rngs(0))
  # the benchmark's prompt, 2,048 tokens at batch 64 x 16 heads (16 GiB of scores), goes in chunks
  rows = attention.query_chunk(64, 16, 2048, 2048, attention.PREFILL_SCORE_BYTES)
  assert rows < 2048 and 64 * 16 * rows * 2048 * 4 <= attention.PREFILL_SCORE_BYTES
  x = jnp.asarray(tokens((B, P), VOCAB))
  prefill = lambda m, x: m.step(x, m.init_cache(B, P + 2), last_only=True, fresh=True)
  whole = jax.jit(prefill)(model, x)
  monkeypatch.setattr(attention, "PREFILL_SCORE_BYTES", scores // 16)  # chunks of 32 rows
  chunked = jax.jit(lambda m, x: prefill(m, x))(model, x)  # a new function: traced anew
  for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(chunked)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  args, static = _program(model, tokens((B, P), VOCAB), 2)
  compiled = generation._generate_ragged.lower(*args, **static).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < scores / 2


def _greedy_continues(model, prompts, new):
  """Each row of `new` is the greedy continuation of its prompt: one forward pass over prompt +
  generated tokens (zeros after them: causal) picks every generated token."""
  x = np.zeros((len(prompts), max(len(p) + len(g) for p, g in zip(prompts, new))), np.int32)
  for row, (p, g) in enumerate(zip(prompts, new)):
    x[row, :len(p) + len(g)] = p + g
  logits = np.asarray(jax.jit(lambda m, x: m(x))(model, jnp.asarray(x)))
  for row, (p, g) in enumerate(zip(prompts, new)):
    assert logits[row, len(p) - 1:len(p) + len(g) - 1].argmax(-1).tolist() == g, f"row {row}"


@pytest.mark.parametrize("config", [
    dict(mixer="gated_deltanet", attn_ratio="1:1", attn_short_conv=True, window=6),
    dict(mixer="rwkv6", block="rwkv6", attn_ratio="1:1")], ids=["gdn_attention", "rwkv6_blocks"])
def test_prompt_lengths_of_one_bucket_share_one_program(config):
  """Prompts padded to one width (16): equal lengths (prefilled whole), then rows of different
  lengths (prefilled up to the shortest, 3, under the convolutions' width), in one program, each
  row its own prompt's greedy continuation."""
  model = HybridLM(tiny_config(**config, vocab_size=VOCAB), nnx.Rngs(0))
  compiled = generation._generate_ragged._cache_size()
  for length in (9, 13):
    prompts = tokens((2, length), VOCAB, seed=length)
    out = np.asarray(generation.generate(model, prompts, 4))
    np.testing.assert_array_equal(out[:, :length], prompts)
    _greedy_continues(model, prompts.tolist(), out[:, length:].tolist())
  prompts = [tokens((16,), VOCAB, seed=1).tolist(), tokens((3,), VOCAB, seed=2).tolist()]
  new = generation.generate_ragged(model, prompts, 4)
  _greedy_continues(model, prompts, new)
  assert generation._generate_ragged._cache_size() == compiled + 1
