"""RWKV-6 channel mixing against fla's RWKV6FeedForward written out in numpy, its shift state
continuing a sequence and stopping at packed-sequence starts; LayerNorm against its formula."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lineax_lm.layers.channel_mix import RWKV6ChannelMix, channel_mix_width
from lineax_lm.layers.common import LayerNorm, LayerSpec
from tests.lineax_lm.tiny import HIDDEN, INIT_STD

B, L, WIDTH = 2, 9, 64


def random_channel_mix():
  """A channel mix with every parameter random (mu is zero at init)."""
  layer = RWKV6ChannelMix(HIDDEN, WIDTH, LayerSpec(HIDDEN, init_std=INIT_STD), nnx.Rngs(0))
  state = nnx.state(layer, nnx.Param)
  leaves, tree = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  nnx.update(layer, jax.tree.unflatten(tree, [v + 0.3 * jax.random.normal(k, v.shape)
                                              for v, k in zip(leaves, keys)]))
  return layer


def fla_feed_forward(layer, x):
  """fla 0.6.0's RWKV6FeedForward.forward without a cache, in float64."""
  p = lambda v: np.asarray(v[...], np.float64)
  shifted = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], 1)
  delta = shifted - x
  key = np.maximum((x + delta * p(layer.key.mu)) @ p(layer.key.linear.kernel), 0) ** 2
  receptance = (x + delta * p(layer.receptance.mu)) @ p(layer.receptance.linear.kernel)
  return (key @ p(layer.value.kernel)) / (1 + np.exp(-receptance))


def test_channel_mix_is_fla_feed_forward_and_its_shift_state_continues_a_sequence():
  layer = random_channel_mix()
  x = jnp.asarray(np.random.default_rng(0).normal(size=(B, L, HIDDEN)), jnp.float32)
  y, shift = layer(x)
  np.testing.assert_allclose(np.asarray(y), fla_feed_forward(layer, np.asarray(x, np.float64)),
                             atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(np.asarray(shift), np.asarray(x[:, -1:]))
  head, state = layer(x[:, :5])
  tail, _ = layer(x[:, 5:], state)
  np.testing.assert_allclose(np.asarray(jnp.concatenate([head, tail], 1)), np.asarray(y), atol=1e-5)
  ids = jnp.asarray([[0] * 4 + [1] * 5] * B)  # a second sequence starts at 4: no shift across it
  packed, _ = layer(x, reset_ids=ids)
  np.testing.assert_allclose(np.asarray(packed[:, 4:]), np.asarray(layer(x[:, 4:])[0]), atol=1e-5)


def test_channel_mix_width_is_fla_rule():
  assert channel_mix_width(1024) == 3584 and channel_mix_width(32) == 128
  assert channel_mix_width(100, 3.5) == 352  # 350 rounded up to a multiple of 32


def test_layer_norm_with_bias():
  norm = LayerNorm(HIDDEN, 1e-5, LayerSpec(HIDDEN), nnx.Rngs(0))
  norm.weight[...] = jnp.arange(HIDDEN, dtype=jnp.float32) / HIDDEN
  norm.bias[...] = jnp.ones(HIDDEN) * 0.5
  x = np.random.default_rng(1).normal(size=(3, HIDDEN)) * 4 + 2
  want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  want = want * np.asarray(norm.weight[...]) + 0.5
  np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x, jnp.float32))), want, atol=1e-5)
