"""The fused chunked cross-entropy (train.losses) equals the plain float32-logits objective: loss,
accuracy and every parameter gradient, on one device and under a (data, tensor) mesh."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from lineax_lm import sharding
from lineax_lm.train.losses import chunked_cross_entropy
from lineax_lm.train.trainer import Trainer, validate_config

from tests.lineax_lm.train.test_trainer import tiny_config


def plain_cross_entropy(x, head, targets, mask):
  logits = jnp.einsum("bld,dv->blv", x, head, preferred_element_type=jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(ce * mask), jnp.sum((jnp.argmax(logits, -1) == targets) * mask)


@pytest.mark.parametrize("chunk_tokens", [3 * 7, 2 * 16, 2 * 100])  # 7 does not divide 16; whole
def test_chunked_cross_entropy_equals_plain(chunk_tokens):
  rng = np.random.default_rng(0)
  B, L, D, V = 3, 16, 8, 24
  x = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  head = jnp.asarray(rng.normal(size=(D, V)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, V, (B, L)), jnp.int32)
  mask = jnp.asarray(rng.integers(0, 2, (B, L)), jnp.float32)

  def loss(fn):
    return jax.jit(jax.value_and_grad(lambda x, h: fn(x, h)[0] * 0.5, argnums=(0, 1)))(x, head)
  want = loss(lambda x, h: plain_cross_entropy(x, h, targets, mask))
  got = loss(lambda x, h: chunked_cross_entropy(x, h, targets, mask, chunk_tokens))
  for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(chunked_cross_entropy(x, head, targets, mask, chunk_tokens)[1],
                                plain_cross_entropy(x, head, targets, mask)[1])


def _batch(B, L, vocab, kind, seed=0):
  rng = np.random.default_rng(seed)
  batch = {"inputs": rng.integers(0, vocab, (B, L), dtype=np.int32),
           "targets": rng.integers(0, vocab, (B, L), dtype=np.int32),
           "loss_mask": np.ones((B, L), np.int32)}
  if kind == "masked":
    batch["loss_mask"] = rng.integers(0, 2, (B, L), dtype=np.int32)
  if kind in ("packed", "overflow"):  # a new sequence starts at a few random positions of each row
    starts = rng.random((B, L)) < (0.5 if kind == "overflow" else 0.1)
    starts[:, 0] = True
    batch["segment_ids"] = np.cumsum(starts, axis=1).astype(np.int32)
  return batch


def _sums_and_grads(mesh_shape, loss_chunk, kind, **model):
  config = tiny_config(attn_ratio="1:1", **model)
  config.train.loss_chunk = loss_chunk
  batch = _batch(config.data.global_batch_size, config.data.seq_len, config.model.vocab_size, kind)
  if kind == "packed":  # the static bound met exactly: the xla path pads every sequence to a chunk
    config.model.max_segments = int(batch["segment_ids"].max())
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = Mesh(np.array(devices).reshape(mesh_shape), sharding.MESH_AXES,
              axis_types=(jax.sharding.AxisType.Auto,) * len(sharding.MESH_AXES))
  trainer = Trainer(config, validate_config(config, mesh), mesh)
  with jax.set_mesh(mesh):
    params = trainer.init()["params"]
    out = jax.jit(trainer._grads)(params, trainer.put_batch(batch))
  return jax.device_get(out)


def _assert_same_grads(grads_f, grads):
  """Every gradient within 1e-5 of its tensor's largest entry (reduction order differs)."""
  leaves_f = jax.tree_util.tree_leaves(grads_f)
  assert len(leaves_f) == len(jax.tree_util.tree_leaves(grads))
  for (path, g), g_f in zip(jax.tree_util.tree_leaves_with_path(grads), leaves_f):
    scale = np.max(np.abs(g)) + 1e-30
    np.testing.assert_allclose(g_f / scale, g / scale, rtol=0, atol=1e-5, err_msg=str(path))


@pytest.mark.slow  # two train-step compiles per case
# Packing on one device, the loss mask on the sharded mesh: each of the two (the packed case is the
# costly compile) once, rather than every pairing.
@pytest.mark.parametrize("kind, mesh_shape", [
    ("packed", (1, 1, 1, 1)),
    pytest.param("masked", (4, 1, 1, 2), marks=pytest.mark.multi_device)],
    ids=["1dev-packed", "data4_tensor2-masked"])
def test_fused_loss_step_equals_plain_step(kind, mesh_shape):
  """The fused chunked loss against float32 logits: loss and gradients of the whole step (the
  scanned layers are checked against the loop in tests/lineax_lm/models/test_hybrid.py)."""
  # Per device 8 / 4 = 2 rows (or 8 on one device) of 32 positions; chunks of 5 positions: the
  # last chunk overlaps the one before it.
  rows = 8 // mesh_shape[0]
  grads, loss, correct, count = _sums_and_grads(mesh_shape, 0, kind)
  grads_f, loss_f, correct_f, count_f = _sums_and_grads(mesh_shape, 5 * rows, kind)
  np.testing.assert_allclose(loss_f, loss, rtol=1e-5)
  assert correct_f == correct and count_f == count
  _assert_same_grads(grads_f, grads)


@pytest.mark.slow  # two train-step compiles
def test_fused_loss_tied_embeddings():
  grads, loss, *_ = _sums_and_grads((1, 1, 1, 1), 0, "plain", tie_embeddings=True)
  grads_f, loss_f, *_ = _sums_and_grads((1, 1, 1, 1), 24, "plain", tie_embeddings=True)
  np.testing.assert_allclose(loss_f, loss, rtol=1e-5)
  _assert_same_grads(grads_f, grads)


@pytest.mark.slow  # a train-step compile
def test_packed_row_overflow_makes_the_fused_loss_nan():
  _, loss, *_ = _sums_and_grads((1, 1, 1, 1), 16, "overflow", max_segments=2)
  assert np.isnan(loss)
