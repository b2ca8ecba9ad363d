"""Context parallelism on the 8 fake CPU devices: one sequence split over the mesh's `context` axis
gives what one device gives: the short convolution's halo, attention over gathered keys and values,
and a training step of a hybrid (a linear mixer with short convolutions + attention), with and
without packed rows. Each linear op's own context path is tested in
tests/pallas_kernels/test_context_parallel.py."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from lineax_lm import sharding
from lineax_lm.layers import Context, LayerSpec, mixer_config
from lineax_lm.layers.attention import Attention
from lineax_lm.layers.common import ShortConv
from lineax_lm.models.hybrid import HybridLM, make_packing
from lineax_lm.train.trainer import Trainer, validate_config
from lineax_lm.train.validation import check_config
from tests.lineax_lm.train.test_loss import _assert_same_grads, _batch
from tests.lineax_lm.train.test_trainer import tiny_config

pytestmark = pytest.mark.multi_device

B, L = 2, 32


def _mesh(data=1, fsdp=1, context=1, tensor=1):
  shape = (data, fsdp, context, tensor)
  devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
  return Mesh(devices, sharding.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def _segment_ids(seed=0):
  """Packed rows whose sequences start at slice boundaries (8, 16 of 4 slices of 8), one and two
  tokens after one (the halo then holds tokens of both sequences) and inside slices."""
  starts = np.zeros((B, L), bool)
  starts[:, 0] = True
  starts[0, [8, 17, 21, 30]] = True
  starts[1, [5, 16, 26]] = True
  return np.cumsum(starts, axis=1).astype(np.int32)


def _value_and_grads(fn, module, *args):
  """fn(module, *args) and the gradients of its sum of squares w.r.t. the module's parameters and
  the first arg, under jit."""
  graphdef, params = nnx.split(module)

  def loss(params, x, *rest):
    y = fn(nnx.merge(graphdef, params), x, *rest)
    return jnp.sum(y.astype(jnp.float32) ** 2), y
  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, *args)
  return jax.device_get((y, grads))


def _assert_same(one_device, split):
  (y1, g1), (ys, gs) = one_device, split
  np.testing.assert_allclose(ys, y1, rtol=1e-5, atol=1e-6)
  _assert_same_grads(gs, g1)


def test_short_conv_halo_crosses_devices_and_stops_at_sequence_starts():
  """Packed rows (the step tests run the unpacked halo)."""
  conv = ShortConv(16, 4, LayerSpec(16, init_std=0.5), nnx.Rngs(0), bias=True)
  x = jax.random.normal(jax.random.key(1), (B, L, 16))
  reset_ids = make_packing(_segment_ids(), 8)[0].reset_ids
  run = lambda conv, x, ids: conv(x, None, ids)[0]
  want = _value_and_grads(run, conv, x, reset_ids)
  mesh = _mesh(data=2, context=4)
  with jax.set_mesh(mesh):
    assert sharding.context_axis(L) == "context"
    lowered = jax.jit(run).lower(conv, x, reset_ids).as_text()
    got = _value_and_grads(run, conv, x, reset_ids)
  assert "collective_permute" in lowered  # the halo, not an XLA-chosen gather
  _assert_same(want, got)


@pytest.mark.parametrize("packed,window", [(False, None), (True, 6)], ids=["causal", "packed_window"])
def test_attention_over_gathered_keys_equals_one_device(packed, window):
  cfg = mixer_config("attention", num_heads=4, num_kv_heads=2, window=window, backend="xla")
  attn = Attention(cfg, LayerSpec(32, init_std=0.2), nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (B, L, 32))
  if packed:
    packing, positions, _ = make_packing(_segment_ids(), 8)
  else:
    packing, positions = None, jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
  run = lambda attn, x, positions, packing: attn(x, None, Context(positions, packing))[0]
  want = _value_and_grads(run, attn, x, positions, packing)
  with jax.set_mesh(_mesh(context=4, tensor=2)):  # heads split over tensor as well
    lowered = jax.jit(run).lower(attn, x, positions, packing).as_text()
    got = _value_and_grads(run, attn, x, positions, packing)
  assert "all_gather" in lowered
  _assert_same(want, got)


def _step_config():
  # simple GLA (Mamba-2's recurrence) with its q/k/v short convolutions: Gated DeltaNet passes the
  # same test at 1.7x its compile time
  config = tiny_config(attn_ratio="1:1", mixer="simple_gla", mixer_cfg=dict(num_heads=2))
  config.data.global_batch_size = 2
  config.train.loss_chunk = 4  # the fused head + loss, several chunks per device's slice
  return config


@pytest.fixture(scope="module")
def step_params():
  """The tiny hybrid's parameters, drawn once (no mesh) for every mesh of the step tests."""
  config = _step_config()
  return jax.device_get(nnx.state(HybridLM(validate_config(config, _mesh()), nnx.Rngs(0)), nnx.Param))


def _step_grads(params, **mesh_sizes):
  """{kind: (gradients, loss sum, correct count, token count)} of one training batch without and
  one with packed rows, on the mesh (one program for both: half the compiles)."""
  config, mesh = _step_config(), _mesh(**mesh_sizes)
  trainer = Trainer(config, validate_config(config, mesh), mesh)
  shape = (config.data.global_batch_size, config.data.seq_len, config.model.vocab_size)
  with jax.set_mesh(mesh):
    params = jax.device_put(params, trainer.state_sharding["params"])
    batches = {kind: trainer.put_batch(_batch(*shape, kind)) for kind in ("plain", "packed")}
    grads = jax.jit(lambda params, batches: {k: trainer._grads(params, b) for k, b in batches.items()})
    return jax.device_get(grads(params, batches))


@pytest.mark.slow  # two gradient compiles
def test_context_parallel_step_equals_one_device(step_params):
  """Loss and every gradient of a 2-layer hybrid (simple GLA with its short convolutions, then
  attention) with each sequence split over 4 devices (and the rows over 2) equal one device's, with
  and without packed rows."""
  one_device, split = _step_grads(step_params), _step_grads(step_params, data=2, context=4)
  for kind in ("plain", "packed"):
    grads, loss, correct, count = one_device[kind]
    grads_c, loss_c, correct_c, count_c = split[kind]
    np.testing.assert_allclose(loss_c, loss, rtol=1e-5, err_msg=kind)
    assert (correct_c, count_c) == (correct, count), kind
    _assert_same_grads(grads_c, grads)


def test_mesh_config_context_axis_and_its_errors():
  config = _step_config()
  config.mesh.update(dict(data=-1, context=4))
  assert dict(sharding.make_mesh(config.mesh).shape) == dict(data=2, fsdp=1, context=4, tensor=1)
  del config.mesh["context"]  # a config written before the axis existed: context 1
  assert sharding.make_mesh(config.mesh).shape["context"] == 1
  config.mesh.context = 0
  with pytest.raises(ValueError, match=r"config.mesh.context=0: must be an integer >= 1, or -1"):
    check_config(config)
  config.mesh.context, config.data.seq_len = 4, 30
  with pytest.raises(ValueError, match=r"config.data.seq_len=30 is not divisible by the mesh's context"):
    validate_config(config, sharding.make_mesh(config.mesh))


def test_context_axis_must_stay_within_one_process():
  procs = lambda ids: np.vectorize(lambda i: SimpleNamespace(process_index=i))(np.array(ids))
  mesh = lambda ids: SimpleNamespace(devices=procs(ids), axis_names=sharding.MESH_AXES)
  assert sharding.context_within_processes(mesh([[[[0], [0]]], [[[1], [1]]]]))  # data 2, context 2
  assert not sharding.context_within_processes(mesh([[[[0], [1]]], [[[0], [1]]]]))
