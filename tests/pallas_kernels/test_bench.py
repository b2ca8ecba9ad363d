"""The op benchmark: a row per op and backend in OUT/ops.json, its tables again from that file with
--report (another tree's rows beside with --baseline), and one-line errors for a flag it cannot
read (an op or backend it does not know, a malformed shape)."""
import json

import pytest

from pallas_kernels import bench
from pallas_kernels.common import dispatch


def test_every_family_has_its_arguments():
  assert tuple(bench.ARGUMENTS) == dispatch.FAMILIES


def test_rows_are_written_and_reported(tmp_path, capsys):
  argv = ["--ops", "hgrn", "--backends", "reference", "--shapes", "1x64", "--hkv", "1,16,16",
          "--calls", "1", "--reps", "1", "--out", str(tmp_path)]
  bench.main(argv)
  (row,) = json.load(open(tmp_path / "ops.json"))["rows"]
  assert row["op"] == "hgrn" and row["shape"] == "1x64"
  assert row["fwd_ms"] > 0 and row["fwdbwd_ms"] > 0
  capsys.readouterr()
  for where in ("--out", "--fla"):  # the --fla folder holds ops.json when no --out is given
    bench.main(["--report", where, str(tmp_path)])
    assert "| hgrn | 1x64 | reference | 1 | " in capsys.readouterr().out


def test_a_baseline_is_reported_beside_our_rows(tmp_path, capsys):
  """--baseline DIR (benchmarks/ab.sh): the other tree's row of the same op, backend, shape and
  segment count beside ours, as baseline/ours ratios; a row the baseline lacks says so."""
  row = dict(op="hgrn", backend="gpu", shape="4x4096", segments="1", fwd_ms=1.0, fwdbwd_ms=2.0,
             compile_s=3.0, peak_GiB=0.5)
  for name, rows in (("this", [row, dict(row, shape="8x8192")]),
                     ("base", [dict(row, fwd_ms=1.5, fwdbwd_ms=1.0, peak_GiB=0.75)])):
    (tmp_path / name).mkdir()
    json.dump(dict(rows=rows, profile={}, variants=[], scaling=[], traces={}),
              open(tmp_path / name / "ops.json", "w"))
  bench.main(["--report", "--out", str(tmp_path / "this"), "--baseline", str(tmp_path / "base")])
  out = capsys.readouterr().out
  assert "| hgrn | 4x4096 | gpu | 1 | 1.000 / 2.000 | 1.500 / 1.000 | 1.500x | 0.500x | 0.50 | 0.75 |" in out
  assert "| hgrn | 8x8192 | gpu | 1 | no baseline row |" in out


@pytest.mark.parametrize("argv,message", [
    (["--ops", "nope"], "--ops: unknown op"),
    (["--backends", "cuda"], "--backends: unknown backend"),
    (["--report"], "--report prints the tables of OUT"),
    (["--shapes", "4x4096,8"], r"--shapes: \['8'\] are not BxT"),
    (["--hkv=16,128"], "--hkv: '16,128': give 3 integers"),
    (["--calls", "0"], "flag --calls=0: 0 is not a positive integer"),
    (["--dtype", "bf16"], "--dtype: 'bf16' is not a dtype"),
    (["--segments", "1,all"], r"--segments: \['all'\] are neither counts nor 'auto'"),
    (["--baseline", "/nonexistent"], r"--baseline /nonexistent: no ops.json there")])
def test_bad_flags_say_which(argv, message, monkeypatch):
  monkeypatch.delenv("OUT", raising=False)
  with pytest.raises(SystemExit, match=f"^error: {message}"):
    bench.main(argv)


def test_variants_name_a_family_and_its_config_fields():
  (gdn, cfg), (family, mcfg) = bench.variants("warps_wy=8+bv_state=16,mlstm:warps_chunk=8")
  assert gdn == "gated_delta_rule" and (cfg.warps_wy, cfg.bv_state) == (8, 16)
  assert family == "mlstm" and mcfg.warps_chunk == 8
  with pytest.raises(ValueError, match=r"VARIANTS: 'mlstm:warps_wy=8': give mlstm's Config fields"):
    bench.variants("mlstm:warps_wy=8")
  with pytest.raises(ValueError, match=r"VARIANTS: 'hgrn:warps=2': tile variants are timed for"):
    bench.variants("hgrn:warps=2")


def test_a_variant_runs_the_family_kernels_with_its_config():
  """The variant's function (the GPU module with a Config) computes the public op's output."""
  import numpy as np
  timer = bench.Timer(interpret=True)
  inputs = bench.make_inputs(1, 128, 1, 16, 16, "float32")
  (_, cfg), = bench.variants("mlstm:warps_chunk=8+bv_chunk=8")
  outs = []
  for config in (None, cfg):
    fn, names = timer.op_fn("mlstm", "gpu", config)
    outs.append(fn(*(inputs[n] for n in names)))
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


def test_gpu_defaults_give_ops_traced_inside_the_variant():
  """A whole model's step on a variant (train_step.py's "preset#V"): the family's GPU function takes
  the variant's Config as its default inside, its own again after, also when the body raises."""
  from pallas_kernels.gated_delta_rule import gpu
  default = gpu.chunk_gated_delta_rule.__kwdefaults__["config"]
  with pytest.raises(RuntimeError):
    with bench.gpu_defaults("keep_states=1+bv_state=16"):
      assert gpu.chunk_gated_delta_rule.__kwdefaults__["config"] == gpu.Config(keep_states=1,
                                                                                bv_state=16)
      raise RuntimeError
  assert gpu.chunk_gated_delta_rule.__kwdefaults__["config"] is default
  with bench.gpu_defaults(""):
    assert gpu.chunk_gated_delta_rule.__kwdefaults__["config"] is default


def test_the_forward_runs_whole():
  """fwd_bwd times the forward and the backward as two programs. A program that returns only the
  gradients has the output dead, and XLA drops the forward's kernel that forms it (here a host
  callback standing for a state pass that also writes o, formed again in the backward): a model
  and fla's autograd run it. The gradients are jax.grad's."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  calls = {"forward": 0, "backward": 0}

  def state_pass(x, side):
    def kernel(x):
      calls[side] += 1
      return np.sin(x)
    return jax.pure_callback(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

  @jax.custom_vjp
  def op(x):
    return state_pass(x, "forward")
  op.defvjp(lambda x: (state_pass(x, "forward"), x),
            lambda x, g: (g * state_pass(x, "backward"),))  # the states formed again

  x = jnp.linspace(0.0, 1.0, 8)
  fb = bench.fwd_bwd(op, (x,))
  one_program = jax.jit(jax.grad(lambda do, x: jnp.sum(op(x) * do), argnums=1))
  for run, forward_calls in ((lambda: one_program(fb.do, x), 0), (lambda: fb.step(fb.do, x)[0], 1)):
    jax.block_until_ready(run())
    calls.update(forward=0, backward=0)
    grad = jax.block_until_ready(run())
    assert calls == {"forward": forward_calls, "backward": 1}
    np.testing.assert_allclose(grad, fb.do * np.sin(x), rtol=1e-6)
  assert fb.compile_s > 0 and fb.peak_GiB > 0


def test_the_timed_programs_launch_what_a_models_step_launches():
  """The gated delta rule at the 475M model's head dims (K = 256, V = 512), lowered for CUDA on the
  CPU (pallas_kernels.gpu_aot): the two programs fwd_bwd times launch the 9 kernels a layer of the
  model's step runs; one program returning only the gradients launches 7, without the forward's
  state pass and output kernel."""
  import jax
  import jax.numpy as jnp
  from pallas_kernels import gpu_aot
  inputs = bench.make_inputs(1, 256, 2, 256, 512, jnp.bfloat16)
  fn, names = bench.Timer().op_fn("gated_delta_rule", "gpu")
  args = tuple(jax.ShapeDtypeStruct(inputs[n].shape, inputs[n].dtype) for n in names)
  o, vjp = jax.eval_shape(bench.forward_program(fn), *args)
  kernels = lambda f, *a: sorted(k.name for k in gpu_aot.triton_kernels(f, *a))  # noqa: E731
  forward = kernels(bench.forward_program(fn), *args)
  backward = kernels(bench.backward_program, vjp, o)
  assert forward == ["_output_kernel", "_state_kernel", "_wy_fwd_kernel"]
  assert len(forward + backward) == 9 and backward.count("_state_kernel") == 1
  one_program = kernels(jax.grad(lambda do, *a: jnp.sum(fn(*a) * do), argnums=(1, 2, 3, 4, 5)), o,
                        *args)
  assert len(one_program) == 7 and "_output_kernel" not in one_program
