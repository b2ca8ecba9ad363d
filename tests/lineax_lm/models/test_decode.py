"""Prefill (chunk ops) + token-by-token decode (fused_recurrent ops) reproduces the full-sequence
logits for every mixer, for a 3:1 hybrid and for RWKV-6 blocks."""
import jax
import jax.numpy as jnp
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
