"""Prefill (chunk ops) + token-by-token decode (fused_recurrent ops) reproduces the full-sequence
logits for every mixer, for a 3:1 hybrid and for RWKV-6 blocks; a prompt padded to a compiled width
(step's `length`) prefills as the prompt alone."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lineax_lm.layers import LINEAR_MIXERS
from lineax_lm.models.hybrid import HybridLM
from tests.lineax_lm.tiny import tiny_config, tokens

B, L, P = 2, 21, 13  # batch, sequence, prompt (prefill) length


def decode_matches_full(config):
  model = HybridLM(config, nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  x = jnp.asarray(tokens((B, L)))

  @jax.jit
  def run(state, x):
    m = nnx.merge(graphdef, state)
    full = m(x)
    logits, cache = m.step(x[:, :P], m.init_cache(B, L))

    def one(cache, tok):
      lg, cache = m.step(tok[:, None], cache)
      return cache, lg[:, 0]

    cache, rest = jax.lax.scan(one, cache, x[:, P:].T)
    return full, jnp.concatenate([logits, rest.transpose(1, 0, 2)], axis=1), cache["pos"]

  full, stepped, pos = run(state, x)
  assert int(pos) == L
  assert float(jnp.std(full)) > 0.1  # a real signal, not a vanishing one
  err = float(jnp.max(jnp.abs(full - stepped)))
  # float32 on CPU: measured 1.6e-6 to 8.6e-6 over every mixer and the hybrid (mamba2 the largest).
  assert err < 5e-5, f"decode logits differ from the full forward by {err}"


# One linear mixer and the Transformer in test-fast; every other mixer is `slow` (a model each).
@pytest.mark.parametrize("mixer", [m if m in ("gated_deltanet", "transformer") else
                                   pytest.param(m, marks=pytest.mark.slow)
                                   for m in LINEAR_MIXERS + ("transformer",)])
def test_decode_matches_full_forward(mixer):
  decode_matches_full(tiny_config(mixer))


def test_decode_matches_full_forward_hybrid_3to1():
  config = tiny_config("gated_deltanet", num_layers=4, attn_ratio="3:1", window=8)
  assert config.attention_indices == (3,)
  decode_matches_full(config)


def test_decode_matches_full_forward_rwkv6_blocks_3to1():
  """fla's RWKV-6 blocks: the channel mixing's token shift is carried in the cache too, around the
  attention layer as around the RWKV-6 layers."""
  decode_matches_full(tiny_config("rwkv6", block="rwkv6", num_layers=4, attn_ratio="3:1"))


def test_decode_matches_full_forward_attention_with_short_convolutions():
  decode_matches_full(tiny_config("transformer", attn_short_conv=True))


WIDTH = 16  # the compiled width a prompt is padded to


@jax.jit
def _padded_prefill(model, x, follow, n):
  """step(fresh, length=n) on x [B, WIDTH]: the logits at n - 1, the cache, and one decode step of
  `follow` [B, 1] from that cache (whose attention overwrites slot n before reading it)."""
  logits, cache = model.step(x, model.init_cache(B, L), last_only=True, fresh=True, length=n)
  return logits, cache, model.step(follow, cache)[0]


@functools.partial(jax.jit, static_argnames="n")
def _prompt_alone(model, x, follow, n):
  logits, cache = model.step(x[:, :n], model.init_cache(B, L), last_only=True, fresh=True)
  return logits, cache, model.step(follow, cache)[0]


def padded_prefill_matches(config, lengths=(2, 9, WIDTH)):
  """A prompt of n tokens padded to WIDTH: the same logits, cache (attention slots < n) and next
  step as the prompt alone, for n below the convolutions' width, inside WIDTH and equal to it."""
  model = HybridLM(config, nnx.Rngs(0))
  x, follow = jnp.asarray(tokens((B, WIDTH))), jnp.asarray(tokens((B, 1), seed=1))
  for n in lengths:
    padded = _padded_prefill(model, x, follow, jnp.int32(n))
    alone = _prompt_alone(model, x, follow, n)
    assert float(jnp.std(alone[0])) > 0.1
    assert int(padded[1]["pos"]) == n
    for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(alone),
                                 jax.tree_util.tree_leaves(padded)):
      if jax.tree_util.keystr(path[-1:]) in ("['k']", "['v']"):  # attention slots: the prompt's
        want, got = want[:, :n], got[:, :n]
      # float32 on CPU: the chunk ops over the prompt as one of a row's sequences or as the row
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                 err_msg=f"length {n}: {jax.tree_util.keystr(path)}")


# Two in test-fast: a matrix state and mLSTM's tuple of states; every other mixer is `slow`.
@pytest.mark.parametrize("mixer", [m if m in ("gated_deltanet", "mlstm") else
                                   pytest.param(m, marks=pytest.mark.slow)
                                   for m in LINEAR_MIXERS])
def test_a_padded_prompt_prefills_as_the_prompt_alone(mixer):
  """Every linear mixer (with its short convolutions where it has them) beside an attention layer
  with short convolutions: 1:1, both kinds of layer in one model."""
  padded_prefill_matches(tiny_config(mixer, attn_ratio="1:1", attn_short_conv=True))


@pytest.mark.gpu
@pytest.mark.parametrize("mixer", LINEAR_MIXERS)
def test_a_padded_prompt_prefills_as_the_prompt_alone_with_the_gpu_kernels(mixer):
  """The padding's neutral inputs (`layers.common.run_op`) through the Pallas GPU kernels; the
  model's float32 GEMMs in IEEE float32, as on the CPU, so that the tolerance is the CPU's."""
  with jax.default_matmul_precision("float32"):
    padded_prefill_matches(tiny_config(mixer, attn_ratio="1:1", attn_short_conv=True, backend="gpu"))


def test_a_padded_prompt_prefills_as_the_prompt_alone_rwkv6_blocks():
  """fla's RWKV-6 blocks: the token shifts of the time and the channel mixing."""
  padded_prefill_matches(tiny_config("rwkv6", block="rwkv6", attn_ratio="1:1"))


def test_length_needs_a_fresh_cache():
  model = HybridLM(tiny_config(), nnx.Rngs(0))
  with pytest.raises(ValueError, match="fresh=True"):
    model.step(jnp.asarray(tokens((B, WIDTH))), model.init_cache(B, L), length=3)
