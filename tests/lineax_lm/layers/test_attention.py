"""Attention through jax's splash-attention kernel (Pallas TPU, interpret mode here) against
`jax.nn.dot_product_attention`: outputs and every gradient, GQA, a sliding window, packed rows,
rows and heads over a mesh and the sequence over `context`; and which kernel `attn_impl` takes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lineax_lm.layers import Context, LayerSpec, mixer_config
from lineax_lm.layers.attention import Attention, resolve_impl
from lineax_lm.models.hybrid import make_packing
from tests.lineax_lm.test_context_parallel import _mesh, _value_and_grads
from tests.pallas_kernels.harness import rel_rms

B, L = 2, 256


def test_none_takes_splash_on_a_tpu_and_jax_s_choice_elsewhere():
  assert resolve_impl(None, "tpu", 4096) == "splash"        # compiled for a TPU (also ahead of time)
  assert resolve_impl(None, "auto", 4096) is None           # this CPU host: jax chooses
  assert resolve_impl("splash", "auto", 4096) == "splash"
  assert resolve_impl("splash", "tpu", 100) is None         # not whole 128-token blocks
  assert resolve_impl("cudnn", "tpu", 4096) == "cudnn"
  with pytest.raises(ValueError, match="`attn_impl` must be one of"):
    resolve_impl("flash", "auto", 4096)


def _layer(impl, window):
  cfg = mixer_config("attention", num_heads=4, num_kv_heads=2, window=window, backend="xla",
                     attn_impl=impl)
  return Attention(cfg, LayerSpec(64, init_std=0.2), nnx.Rngs(0))


def _inputs(packed):
  x = jax.random.normal(jax.random.key(1), (B, L, 64))
  if not packed:
    return x, jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L)), None
  starts = np.zeros((B, L), bool)
  starts[:, 0] = True
  starts[0, [100, 128, 129]] = True   # one sequence ends at the 128-token block boundary
  starts[1, [37, 200]] = True
  packing, positions, _ = make_packing(np.cumsum(starts, axis=1).astype(np.int32), 8)
  return x, positions, packing


def _assert_close(want, got):
  """Output and every gradient within docs/DESIGN.md's float32 tolerance (relative RMS < 1e-4):
  the kernel sums its online softmax in another order than the one-pass reference."""
  (y1, g1), (y2, g2) = want, got
  assert rel_rms(y2, y1) < 1e-4
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree_util.tree_leaves(g2)):
    assert rel_rms(b, a) < 1e-4, jax.tree_util.keystr(path)


run = lambda attn, x, positions, packing: attn(x, None, Context(positions, packing))[0]


@pytest.mark.parametrize("packed,window", [(False, None), (True, 50)], ids=["causal", "packed_window"])
def test_splash_equals_dot_product_attention(packed, window):
  args = _inputs(packed)
  want = _value_and_grads(run, _layer(None, window), *args)
  _assert_close(want, _value_and_grads(run, _layer("splash", window), *args))


@pytest.mark.slow
@pytest.mark.multi_device
def test_splash_over_rows_heads_and_context_equals_one_device():
  """Rows over fsdp and heads over tensor (the kernel runs on each device's own), then the
  sequence over `context` too (each device's kernel on its query rows against all keys)."""
  args = _inputs(True)
  want = _value_and_grads(run, _layer(None, 50), *args)
  for mesh in (_mesh(fsdp=2, tensor=2), _mesh(context=2, tensor=2)):
    with jax.set_mesh(mesh):
      _assert_close(want, _value_and_grads(run, _layer("splash", 50), *args))
