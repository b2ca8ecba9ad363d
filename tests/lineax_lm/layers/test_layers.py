"""Every mixer layer: forward shapes, a gradient reaching every parameter, the cache size formula
against a real cache; Llama attention against a direct reference; building blocks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lineax_lm.layers import MIXERS, LayerSpec, build_mixer, mixer_config
from lineax_lm.layers.common import ShortConv, causal_taps, prompt_packing, rope, run_op
from tests.lineax_lm.tiny import HIDDEN, INIT_STD, TINY_MIXER

B, L = 2, 19


def make(name, **kw):
  cfg = mixer_config(name, backend="xla", **{**TINY_MIXER[name], **kw})
  return build_mixer(name, cfg, LayerSpec(HIDDEN, init_std=INIT_STD), nnx.Rngs(0))


def inputs(shape=(B, L, HIDDEN), seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_forward_and_gradient(name):
  layer = make(name)
  graphdef, params = nnx.split(layer)
  x, w = inputs(), inputs(seed=1)
  kw = {"lower_bound": jnp.full((getattr(layer, "forget_dim", 1),), 0.3)} if getattr(
      layer, "uses_lower_bound", False) else {}

  @jax.jit
  def loss(params, x):
    y, cache = nnx.merge(graphdef, params)(x, **kw)
    assert cache is None and y.shape == x.shape
    return jnp.sum(y * w)

  value, (g_params, g_x) = jax.value_and_grad(loss, argnums=(0, 1))(params, x)
  assert np.isfinite(float(value))
  assert float(jnp.max(jnp.abs(g_x))) > 0
  for path, g in nnx.to_flat_state(g_params):
    g = np.asarray(g[...])
    assert np.all(np.isfinite(g)), f"{name}: non-finite gradient for {path}"
    if (name, path) in ZERO_FIRST_GRADIENTS:
      assert np.all(g == 0), f"{name}: {path} gets a gradient before its input is nonzero"
    else:
      assert np.any(g != 0), f"{name}: no gradient reaches {path}"


# fla starts RWKV-6's decay LoRA with a zero down-projection: its up-projection's input is zero,
# and so its first gradient (the down-projection's is not, and the next step's is not)
ZERO_FIRST_GRADIENTS = {("rwkv6", ("w_proj", "layers", 2, "kernel"))}


def test_rwkv6_is_initialised_as_fla_initialises_it():
  """fla's RWKV6Attention: xavier_uniform (gain 2^-2.5) projections whatever init_std is, the
  decay's LoRA zero then orthogonal (gain 0.1), the interpolation and bonus zero."""
  layer = make("rwkv6", proj_low_rank_dim=32, gate_low_rank_dim=16)
  p = lambda v: np.asarray(v[...])
  for kernel, fan in ((layer.x_down.kernel, 32 + 160), (layer.x_up, 160 + 32),
                      (layer.r_proj.kernel, 32 + 16), (layer.o_proj.kernel, 32 + 32)):
    bound = 2 ** -2.5 * np.sqrt(6 / fan)
    assert bound * 0.8 < np.abs(p(kernel)).max() <= bound
  up = p(layer.w_proj.layers[2].kernel)  # [16, 16]
  np.testing.assert_allclose(up @ up.T, 0.01 * np.eye(16), atol=1e-6)
  assert not np.any(p(layer.w_proj.layers[0].kernel))
  assert not any(np.any(p(v)) for v in (layer.x_mu, layer.x_bias, layer.bonus))


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_cache_bytes_formula_matches_real_cache(name):
  layer = make(name)
  cache = layer.init_cache(3, 40)
  assert sum(a.nbytes for a in jax.tree.leaves(cache)) == 3 * layer.cache_bytes(40)


def llama_attention_reference(x, wq, wk, wv, wo, n_heads, n_kv, theta, window=None):
  """HF LlamaAttention written out: projections, rotate-half RoPE, repeat_kv, causal softmax."""
  Bx, T, _ = x.shape
  d = wq.shape[1] // n_heads
  q = (x @ wq).reshape(Bx, T, n_heads, d)
  k = (x @ wk).reshape(Bx, T, n_kv, d)
  v = (x @ wv).reshape(Bx, T, n_kv, d)
  inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
  ang = np.arange(T)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
  rot = lambda t: np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1)
  q = q * cos[None, :, None] + rot(q) * sin[None, :, None]
  k = k * cos[None, :, None] + rot(k) * sin[None, :, None]
  k, v = np.repeat(k, n_heads // n_kv, axis=2), np.repeat(v, n_heads // n_kv, axis=2)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
  i, j = np.arange(T)[:, None], np.arange(T)[None]
  allowed = (j <= i) & ((i - j < window) if window else True)
  s = np.where(allowed, s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", p, v).reshape(Bx, T, -1) @ wo


@pytest.mark.parametrize("window", [None, 5])
def test_attention_is_llama_attention(window):
  layer = make("attention", rope_theta=100000.0, window=window)
  x = inputs()
  y, _ = layer(x)
  k = lambda m: np.asarray(m.kernel[...], np.float64)
  ref = llama_attention_reference(np.asarray(x, np.float64), k(layer.q_proj), k(layer.k_proj),
                                  k(layer.v_proj), k(layer.o_proj), 4, 2, 100000.0, window)
  np.testing.assert_allclose(np.asarray(y), ref, atol=2e-5, rtol=1e-4)


def test_attention_short_conv_convolves_q_k_v_before_attention():
  """`use_short_conv` on attention was accepted and ignored; now q, k and v are convolved."""
  layer = make("attention", rope_theta=100000.0, use_short_conv=True)
  x = inputs()
  k = lambda m: np.asarray(m.kernel[...], np.float64)
  xn = np.asarray(x, np.float64)
  convolved = []
  for name in ("q", "k", "v"):
    w = np.asarray(getattr(layer, f"{name}_conv1d").weight[...], np.float64)
    assert abs(w[-1].mean() - 1.0) < 0.2  # the current token's tap starts near 1: near the identity
    h = xn @ k(getattr(layer, f"{name}_proj"))
    hp = np.concatenate([np.zeros((B, 3, h.shape[-1])), h], 1)
    convolved.append(sum(hp[:, j:j + L] * w[j] for j in range(4)))
  # the reference attends over the convolved projections: its input, with identity projections
  identity = [np.eye(64)[:, a:b] for a, b in ((0, 32), (32, 48), (48, 64))]
  ref = llama_attention_reference(np.concatenate(convolved, -1), *identity, k(layer.o_proj), 4, 2,
                                  100000.0)
  y, _ = layer(x)
  np.testing.assert_allclose(np.asarray(y), ref, atol=2e-5, rtol=1e-4)
  cache = layer.init_cache(3, 40)
  assert sum(a.nbytes for a in jax.tree.leaves(cache)) == 3 * layer.cache_bytes(40)


def test_short_conv_is_causal_depthwise_conv_and_respects_resets():
  conv = ShortConv(3, 4, LayerSpec(HIDDEN, init_std=1.0), nnx.Rngs(0), activation=None)
  x = inputs((1, 9, 3))
  w = np.asarray(conv.weight[...])
  xp = np.concatenate([np.zeros((1, 3, 3)), np.asarray(x)], 1)
  ref = sum(xp[:, j:j + 9] * w[j] for j in range(4))
  y, state = conv(x)
  np.testing.assert_allclose(np.asarray(y), ref, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(state), np.asarray(x[:, -3:]))
  ids = jnp.asarray([[0, 0, 0, 0, 0, 1, 1, 1, 1]])
  y2, _ = conv(x, reset_ids=ids)
  y_b, _ = conv(x[:, 5:])
  np.testing.assert_allclose(np.asarray(y2[:, 5:]), np.asarray(y_b), atol=1e-6)
  taps, _ = causal_taps(x, 2, state=x[:, :1] * 0 + 7.0)
  np.testing.assert_array_equal(np.asarray(taps[1][:, 0]), 7.0)


def test_a_padded_prompt_runs_one_call_with_its_padding_neutral():
  """With `neutral`, a prompt padded to a compiled width (prompt_packing) is one plain op call over
  the batch: the neutral inputs take their value from the prompt's end on, the others are as given;
  without it, each row is a packed call of two sequences."""
  calls = []

  def op(q, k, g, *, initial_state=None, output_final_state=False, cu_seqlens=None):
    calls.append(dict(shape=q.shape, k=k, g=g, cu_seqlens=cu_seqlens))
    return q, initial_state

  q, k, g = inputs((B, 8, 4)), inputs((B, 8, 4), seed=1), inputs((B, 8, 4), seed=2)
  state = jnp.zeros((B, 4))
  packing = prompt_packing(jnp.int32(3), B, 8)
  run_op(op, None, (q, k, g), state=state, packing=packing, neutral={1: 0.0, 2: 0.0})
  (call,) = calls
  assert call["shape"] == (B, 8, 4) and call["cu_seqlens"] is None
  np.testing.assert_array_equal(call["k"][:, :3], k[:, :3])
  np.testing.assert_array_equal(call["g"][:, :3], g[:, :3])
  assert not np.any(call["k"][:, 3:]) and not np.any(call["g"][:, 3:])
  calls.clear()
  run_op(op, None, (q, k, g), state=state, packing=packing)
  assert calls[0]["shape"] == (1, 8, 4) and calls[0]["cu_seqlens"] is not None  # under the vmap


def test_rope_preserves_norm_and_relative_positions():
  q, k = inputs((1, 6, 2, 8)), inputs((1, 6, 2, 8), seed=1)
  pos = jnp.arange(6)[None]
  rq, rk = rope(q, pos, 10000.0), rope(k, pos, 10000.0)
  np.testing.assert_allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)
  s1 = jnp.einsum("bqhd,bkhd->bhqk", rq, rk)
  s2 = jnp.einsum("bqhd,bkhd->bhqk", rope(q, pos + 11, 10000.0), rope(k, pos + 11, 10000.0))
  np.testing.assert_allclose(np.asarray(s1), np.asarray(s2), atol=1e-4)


def test_config_errors_name_the_option():
  with pytest.raises(ValueError, match="no option"):
    mixer_config("gla", num_head=2)
  with pytest.raises(ValueError, match="unknown mixer"):
    mixer_config("mamba3")
  with pytest.raises(ValueError, match="expand_ratio"):
    make("hgrn2", expand_ratio=7)
  with pytest.raises(ValueError, match="num_kv_heads"):
    make("attention", num_kv_heads=3)
