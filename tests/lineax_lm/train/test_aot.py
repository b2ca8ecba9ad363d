"""`python -m lineax_lm.train --aot=TOPOLOGY`: the train step compiled for a TPU slice by libtpu
(marker `tpu_aot`), and its clear errors."""
import pytest

from lineax_lm.train import aot
from lineax_lm.train.config import base_config


def tiny_step_config(**mesh):
  """An HGRN layer and an attention layer (their TPU kernels in the step: HGRN's and splash
  attention), hidden 32, MQAR of 128 tokens, plain logits."""
  c = base_config()
  c.model.update(dict(vocab_size=64, num_layers=2, hidden=32, heads=2, mixer="hgrn", attn_ratio="1:1",
                      backend="auto"))
  c.data.mqar.vocab_size = 64
  c.data.update(dict(source="mqar", seq_len=128, global_batch_size=8))
  c.train.loss_chunk = 0
  c.mesh.update(dict(data=2, fsdp=2, **mesh))
  return c


def test_unknown_topology_is_one_clear_error(capsys):
  assert aot.main(tiny_step_config(), "v5x:2x2") == 2
  assert "unknown TPU topology 'v5x:2x2'" in capsys.readouterr().err


@pytest.mark.tpu_aot
def test_a_mesh_that_does_not_divide_the_slice_names_both(capsys):
  assert aot.main(tiny_step_config(tensor=3), "v5e:2x2") == 2
  err = capsys.readouterr().err
  assert "--aot=v5e:2x2 (4 chips)" in err and "'tensor': 3" in err


@pytest.mark.tpu_aot
def test_tiny_step_compiles_for_four_v5e_chips(capsys):
  from lineax_lm.layers import attention
  config = tiny_step_config()
  attention.splash_kernel.cache_clear()
  report = aot.check(config, "v5e-4")
  assert attention.splash_kernel.cache_info().currsize == 1  # attention took the TPU kernel
  assert report.mesh == {"data": 2, "fsdp": 2, "context": 1, "tensor": 1} and report.chips == 4
  assert report.fits and 0 < report.hbm_bytes < report.chip.hbm_bytes
  assert 0.9 < report.flops / report.model_flops < 1.5  # 6 N plus attention, less the gathers
  assert 0 < report.mfu < 1
  # a chip with one byte of HBM: the same step does not fit, and the error says where and what
  small = aot.Report(**{**report.__dict__, "chip": aot.Chip("TPU tiny", 1e12, 1, 1e9, 1)})
  with pytest.raises(aot.DoesNotFit, match=r"GiB per chip.*mesh \{'data': 2, 'fsdp': 2.*remat=full"):
    aot.raise_if_too_big(config, small)
  config.model.scan_layers = True
  assert "--config.model.scan_layers=False" in "\n".join(aot.suggestions(config, small))


@pytest.mark.tpu_aot
def test_a_context_axis_stays_within_each_host_of_a_large_slice():
  """A v5p-128's hosts hold 4 chips each; jax.make_mesh would run a context axis of 4 along the
  torus across hosts, so the mesh puts it within each process and FSDP across them."""
  from lineax_lm import sharding
  from pallas_kernels.tpu_aot import topology_devices
  _, devices = topology_devices("v5p-128")
  mesh = sharding.make_mesh(dict(data=1, fsdp=16, context=4, tensor=1), devices=devices)
  assert dict(mesh.shape) == dict(data=1, fsdp=16, context=4, tensor=1)
  assert sharding.context_within_processes(mesh)
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
  with pytest.raises(ValueError, match=r"context \* tensor = 8 does not fit within one process's 4"):
    sharding.make_mesh(dict(data=1, fsdp=8, context=8, tensor=1), devices=devices)


def test_presets_table_rows_and_markdown():
  rows = aot.table_rows()
  assert len(rows) == len(aot.TABLE_PRESETS) * len(aot.TABLE_TOPOLOGIES) + 1
  assert rows[-1] == aot.LONG_CONTEXT and "--config.mesh.context=4" in rows[-1][2]
  text = aot.table_markdown([(rows[0], {"fits": "yes", "gib": "3.10", "compile_s": 95.0,
                                        "tokens_s": "12,345", "mfu": "41.0%"}),
                             (rows[-1], None), (rows[1], {"error": "timeout (> 1800 s)"})])
  assert "| gated_deltanet_340m | v5e-8 | 4,096 | yes | 3.10 | 95 | 12,345 | 41.0% |" in text
  assert "| gated_deltanet_hybrid_1.3b | v5p-128 | 131,072 | not run |" in text
  assert "| v5p-8 | 4,096 | timeout (> 1800 s) |" in text


def test_the_table_command_names_a_subset_with_no_row():
  with pytest.raises(SystemExit, match=r"^error: no row has --presets nope"):
    aot.table_main(["--presets=nope"])
