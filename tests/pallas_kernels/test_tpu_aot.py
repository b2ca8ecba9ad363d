"""`pallas_kernels.tpu_aot`: topology names, the presets' head dims, and (marker `tpu_aot`, with
libtpu) every family's TPU kernels compiled for a v5e chip at a small shape."""
import dataclasses
import re

import pytest

from pallas_kernels import tpu_aot
from pallas_kernels.tpu_aot import Item, compile_item, parse_topology


def test_topology_names_in_both_forms():
  assert parse_topology("v5p:4x4x4") == ("v5p", "4x4x4")
  assert parse_topology("v5e-8") == ("v5e", "2x4")
  assert parse_topology("v5p-8") == ("v5p", "2x2x1")  # v5p types count TensorCores, two a chip
  assert parse_topology("v5p-128") == ("v5p", "4x4x4")
  assert parse_topology("v6e:4x4") == ("v6e", "4x4")


@pytest.mark.parametrize("bad", ["v4:2x2x1", "v5e", "v5e:2x2x2", "v5p:4x4", "v5p-6", "v5e-12", "tpu"])
def test_unknown_topology_is_one_clear_error_naming_it(bad):
  with pytest.raises(ValueError, match=f"TPU topology '{bad}'"):
    parse_topology(bad)


@pytest.mark.parametrize("argv, says", [(["--chips=v9"], "--chips: unknown ['v9']"),
                                         (["--only=anchor,big"], "--only: unknown ['big']"),
                                         (["--timeout=0"], "timeout"), (["stray"], "unexpected argument")])
def test_bad_command_line_is_one_line_naming_the_flag(argv, says):
  with pytest.raises(SystemExit, match=re.escape(says)):
    tpu_aot.main(argv)


def test_preset_head_dims_are_the_presets_mixers():
  from flax import nnx

  from lineax_lm.layers import LayerSpec, build_mixer
  from lineax_lm.models.presets import get_preset
  mixers = {"gla": "gla", "simple_gla": "simple_gla", "retention": "retention", "rwkv6": "rwkv6",
            "gated_delta_rule": "gated_deltanet", "mlstm": "mlstm"}
  for family, mixer in mixers.items():
    got = []
    for scale in ("340m", "1.3b"):
      config = get_preset(f"{mixer}_{scale}")
      layer = nnx.eval_shape(lambda: build_mixer(mixer, config.linear_mixer_config(),
                                                 LayerSpec(config.hidden), nnx.Rngs(0)))
      if family == "mlstm":
        got.append((layer.inner // layer.head_dim, layer.head_dim, layer.head_dim))
      else:
        H = layer.key_dim // layer.head_k_dim
        got.append((H, layer.head_k_dim, layer.head_v_dim))
    assert got == tpu_aot.PRESET_DIMS[family], family


def test_matrix_runs_the_anchor_of_every_family_on_every_chip_first():
  items = tpu_aot.matrix()
  first = items[:len(tpu_aot.FAMILIES) * len(tpu_aot.CHIPS)]
  assert {(i.family, i.chip) for i in first} == {(f, c) for f in tpu_aot.FAMILIES for c in tpu_aot.CHIPS}
  assert all(i.grad and i.B == 4 and i.T == 4096 and i.H == 16 and i.K == i.V == 128 for i in first)


SMALL = dict(chip="v5e", B=1, T=256, H=2, K=128, V=128)


@pytest.mark.tpu_aot
@pytest.mark.parametrize("family", tpu_aot.FAMILIES)
def test_every_family_compiles_for_a_v5e_chip_with_its_flops(family):
  result = compile_item(Item(family, **SMALL))
  assert result["flops"] > 1e6, result  # the kernels' cost estimates, not just the glue around them
  assert result["temp_bytes"] >= 0 and result["compile_s"] > 0


@pytest.mark.tpu_aot
def test_varlen_and_context_parallel_compile():
  base = Item("gated_delta_rule", **SMALL)
  for item in (dataclasses.replace(base, B=2, varlen=True), dataclasses.replace(base, context=2)):
    assert compile_item(item)["flops"] > 1e6, item


@pytest.mark.tpu_aot
def test_mlstm_compiles_at_the_largest_preset_head():
  """K = V = 1,024 (the 1.3B preset): the state's value tiles fit v5e's scoped VMEM."""
  result = compile_item(Item("mlstm", **dict(SMALL, H=1, K=1024, V=1024)))
  assert result["flops"] > 1e6, result


def test_table_fills_in_parallel_and_a_second_run_compiles_only_what_is_missing(tmp_path):
  out = str(tmp_path / "t.md")
  render = lambda rows: "".join(f"{k}: {r}\n" for k, r in rows)
  calls = []

  def first(key):
    calls.append(key)
    return {"error": "timeout"} if key == "c" else {"v": key.upper()}

  text = tpu_aot.fill_table(["a", "b", "c"], first, render, out, jobs=2)
  assert text == "a: {'v': 'A'}\nb: {'v': 'B'}\nc: {'error': 'timeout'}\n" == open(out).read()
  assert sorted(calls) == ["a", "b", "c"]
  calls.clear()
  text = tpu_aot.fill_table(["a", "b", "c", "d"], first, render, out)
  assert sorted(calls) == ["c", "d"]  # a and b compiled before; c failed and runs again
  assert text.startswith("a: {'v': 'A'}\nb: {'v': 'B'}\n") and text.endswith("d: {'v': 'D'}\n")
