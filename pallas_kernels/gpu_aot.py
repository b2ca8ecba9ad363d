"""The GPU kernels compiled for a Hopper GPU on a host without one: shared memory, registers and
spills of every Triton kernel an op's forward+backward launches, against what an H100 / H200 block
has. A kernel over the shared-memory limit fails only at launch on the device ("Shared memory size
limit exceeded"); here it shows in seconds on a CPU.

    python -m pallas_kernels.gpu_aot                                   # every family, B=1 T=256
    python -m pallas_kernels.gpu_aot --ops gated_delta_rule --hkv 2,256,512 --config bk_state=256
    python -m pallas_kernels.gpu_aot --triton_python /path/to/venv/bin/python   # triton elsewhere

How: jax exports the op for CUDA (`jax.export`, no GPU needed); each Pallas kernel
is a `__gpu$xla.gpu.triton` custom call whose backend config holds its Triton IR (MLIR bytecode),
its name, warps and pipeline stages. The IR is printed as text with jaxlib's Triton dialect, then
compiled for sm_90a by pip's `triton` package (CUDA build, ptxas bundled), in this interpreter if it
imports triton, else in `--triton_python` (this file runs there as a script and imports only
triton). Figures come from pip's Triton, whose version may differ from the one inside jaxlib: close
to the device's, not equal.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time

SHARED_LIMIT = 227 * 1024   # bytes of shared memory one block may use on sm_90 (H100, H200)
TRITON_CALL = "__gpu$xla.gpu.triton"


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str
  num_warps: int
  num_stages: int
  ttir: str  # Triton IR, text


def triton_kernels(fn, *args) -> list[Kernel]:
  """The Triton kernels `jax.jit(fn)(*args)` launches when lowered for CUDA, in program order."""
  import jax
  from jax import export
  from jax._src.interpreters import mlir
  from jax._src.lib import triton
  from jax._src.lib.mlir import ir

  # jax.export keeps the kernels the program runs (a kernel whose outputs go unused is dropped)
  exported = export.export(jax.jit(fn), platforms=("cuda",),
                           disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)])(*args)
  context = mlir.make_ir_context()
  triton.dialect.register_dialect(context)
  configs = []

  def walk(op):
    for region in op.regions:
      for block in region.blocks:
        for inner in block.operations:
          attrs = inner.operation.attributes
          if (inner.operation.name == "stablehlo.custom_call"
              and ir.StringAttr(attrs["call_target_name"]).value == TRITON_CALL):
            configs.append(ir.DictAttr(attrs["mhlo.backend_config"]))
          walk(inner.operation)

  kernels = []
  with context:
    walk(ir.Module.parse(exported.mlir_module()).operation)
    for config in configs:
      module = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)
      kernels.append(Kernel(ir.StringAttr(config["name"]).value,
                            ir.IntegerAttr(config["num_warps"]).value,
                            ir.IntegerAttr(config["num_stages"]).value,
                            module.operation.get_asm()))
  return kernels


def compile_sm90(folder: str) -> list[dict]:
  """Compiles each kernel of `folder` (kernels.json and its .ttir files, `write_kernels`) for
  sm_90a with pip's triton: shared bytes (Triton's allocation), registers and spill stores (ptxas),
  and Triton's compile seconds (TTIR to a cubin on this host: what XLA spends on the kernel while
  compiling a model's step on the GPU host, there on its own CPU)."""
  import triton
  from triton.backends.compiler import GPUTarget
  from triton.backends.nvidia import compiler as nvidia

  try:  # the ptxas Triton compiles sm_90 with (an argument from Triton 3.7 on)
    ptxas = nvidia.get_ptxas(90).path
  except TypeError:
    ptxas = nvidia.get_ptxas().path

  def compile_one(kernel):
    return triton.compile(os.path.join(folder, kernel["file"]), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=kernel["num_warps"], num_stages=kernel["num_stages"]))

  kernels = json.load(open(os.path.join(folder, "kernels.json")))
  # Triton's cache would answer a kernel compiled before at once, and the first compile of a
  # process loads its backend: compile_s is each kernel compiled anew, after one warm-up
  always = os.environ.get("TRITON_ALWAYS_COMPILE")
  os.environ["TRITON_ALWAYS_COMPILE"] = "1"
  rows = []
  try:
    if kernels:
      compile_one(kernels[0])
    for kernel in kernels:
      start = time.perf_counter()
      compiled = compile_one(kernel)
      seconds = time.perf_counter() - start
      ptx = os.path.join(folder, kernel["file"])[:-len(".ttir")] + ".ptx"
      with open(ptx, "w") as f:
        f.write(compiled.asm["ptx"])
      report = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.devnull],
                              capture_output=True, text=True, check=True).stderr
      registers = re.search(r"Used (\d+) registers", report)
      spills = re.search(r"(\d+) bytes spill stores", report)
      rows.append({**{k: kernel[k] for k in ("name", "num_warps", "num_stages")},
                   "shared": compiled.metadata.shared,
                   "registers": int(registers.group(1)) if registers else None,
                   "spill_stores": int(spills.group(1)) if spills else 0, "compile_s": seconds})
  finally:
    if always is None:
      del os.environ["TRITON_ALWAYS_COMPILE"]
    else:
      os.environ["TRITON_ALWAYS_COMPILE"] = always
  return rows


def write_kernels(kernels: list[Kernel], folder: str) -> None:
  os.makedirs(folder, exist_ok=True)
  index = []
  for i, k in enumerate(kernels):
    file = f"{i:02d}_{k.name}.ttir"
    with open(os.path.join(folder, file), "w") as f:
      f.write(k.ttir)
    index.append({"file": file, "name": k.name, "num_warps": k.num_warps, "num_stages": k.num_stages})
  with open(os.path.join(folder, "kernels.json"), "w") as f:
    json.dump(index, f, indent=1)


def compile_kernels(kernels: list[Kernel], triton_python: str | None = None) -> list[dict]:
  """`compile_sm90` of `kernels`, here or in `triton_python`."""
  with tempfile.TemporaryDirectory(prefix="gpu_aot_") as folder:
    write_kernels(kernels, folder)
    if triton_python is None:
      return compile_sm90(folder)
    done = subprocess.run([triton_python, os.path.abspath(__file__), "--compile", folder],
                          capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(f"compiling with --triton_python={triton_python} failed:\n"
                         f"{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def over_limits(row: dict) -> list[str]:
  """What of `row` an sm_90 block cannot hold or would spill."""
  problems = []
  if row["shared"] > SHARED_LIMIT:
    problems.append(f"shared {row['shared'] / 1024:.0f} KiB > {SHARED_LIMIT // 1024} KiB")
  if row["spill_stores"]:
    problems.append(f"{row['spill_stores']} bytes of spill stores")
  return problems


def op_kernels(family: str, B: int, T: int, H: int, K: int, V: int, dtype: str = "bfloat16",
               config=None) -> list[Kernel]:
  """The Triton kernels of `family`'s chunk op, its output and the gradients of every input, with
  the benchmark's inputs (`bench.make_inputs`); `config` replaces the gated delta rule's tiles."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import bench
  inputs = bench.make_inputs(B, T, H, K, V, dtype)
  fn, names = bench.Timer().op_fn(family, "gpu", config)
  args = tuple(jax.ShapeDtypeStruct(inputs[n].shape, inputs[n].dtype) for n in names)
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
  # the loss and its gradients: the forward's output kernels run beside the backward's
  return triton_kernels(jax.value_and_grad(loss, argnums=tuple(range(len(args)))), *args)


def define_flags(fv, argv) -> None:
  from absl import flags

  from pallas_kernels.common import dispatch
  del argv
  flags.DEFINE_list("ops", list(dispatch.FAMILIES), "op families (each has GPU kernels)",
                    flag_values=fv)
  flags.DEFINE_list("shapes", ["1x256"], "BxT (kernels do not depend on T beyond the chunk count)",
                    flag_values=fv)
  flags.DEFINE_list("hkv", ["16", "128", "128"], "H,K,V", flag_values=fv)
  flags.DEFINE_string("dtype", "bfloat16", "of q, k, v", flag_values=fv)
  flags.DEFINE_list("config", [], "gated delta rule tiles, e.g. bk_state=256,stages_state=2 "
                    "(common.gpu.config.Config fields)", flag_values=fv)
  flags.DEFINE_string("triton_python", None, "a Python with pip's `triton` (when this one has "
                      "none)", flag_values=fv)


def main(argv=None):
  """python -m pallas_kernels.gpu_aot [--ops ..] [--shapes BxT,..] [--hkv H,K,V] [--config k=v,..]."""
  from lineax_lm import cli
  from pallas_kernels.bench import _integers
  from pallas_kernels.common import dispatch
  from pallas_kernels.common.gpu.config import Config
  a = cli.parse(define_flags, argv, "python -m pallas_kernels.gpu_aot", __doc__)
  H, K, V = _integers("hkv", a.hkv, 3)
  with_kernels = [f for f in dispatch.FAMILIES if dispatch.support_table()[f, "chunk", "gpu"]]
  if (unknown := sorted(set(a.ops) - set(with_kernels))):
    cli.fail(f"--ops: {unknown} have no GPU kernels; choose from {with_kernels}")
  config = None
  if a.config:
    try:
      fields = dict(item.split("=", 1) for item in a.config)
      config = Config(**{k: type(getattr(Config(), k) or 0)(v) for k, v in fields.items()})
    except (TypeError, ValueError, AttributeError) as e:
      cli.fail(f"--config: {','.join(a.config)!r}: give Config fields as name=integer ({e})")
    if a.ops != ["gated_delta_rule"]:
      cli.fail("--config sets the gated delta rule's tiles: give --ops gated_delta_rule")
  if a.triton_python is None:
    try:
      import triton  # noqa: F401
    except ImportError:
      cli.fail("this Python has no `triton` (pip install triton, a CUDA build): or give "
               "--triton_python PATH")
  print("| op | BxT | kernel | warps | stages | shared KiB | registers | spill bytes | compile s | sm_90 |")
  print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
  failed = 0
  for family in a.ops:
    for shape in a.shapes:
      B, T = _integers("shapes", shape.split("x"), 2)
      for row in compile_kernels(op_kernels(family, B, T, H, K, V, a.dtype, config), a.triton_python):
        problems = over_limits(row)
        failed += bool(problems)
        print(f"| {family} | {shape} | {row['name']} | {row['num_warps']} | {row['num_stages']} | "
              f"{row['shared'] / 1024:.0f} | {row['registers']} | {row['spill_stores']} | "
              f"{row['compile_s']:.1f} | {'; '.join(problems) or 'fits'} |", flush=True)
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  if sys.argv[1:2] == ["--compile"]:  # in --triton_python: only triton is imported
    print(json.dumps(compile_sm90(sys.argv[2])))
  else:
    main()
