"""Every Mosaic TPU kernel compiled by the real TPU compiler, on a machine without a TPU.

libtpu (`pip install "lineax-lm[tpu_aot]"`) compiles for TPU slices that do not exist here:
`jax.experimental.topologies.get_topology_desc` returns a slice's devices, and `jax.jit(f).lower(
<ShapeDtypeStructs on a mesh of them>).compile()` runs the whole TPU compiler, Mosaic included, ahead
of time. This module compiles every family's `chunk_*` op with `backend="tpu"`, forward and
forward+backward, per chip generation, and tabulates the compile time, the temporary HBM bytes
(`memory_analysis`) and the FLOPs (`cost_analysis`, which counts the kernels' own through their
`cost_estimate`).

    python -m pallas_kernels.tpu_aot --out tpu_aot.md                 # the whole matrix
    python -m pallas_kernels.tpu_aot --chips v5e --only anchor        # one chip, the anchor rows

Each item compiles in its own process under `--timeout` seconds, so a slow compile costs one row
(marked "timeout"), never the table; `--jobs N` compiles N at a time (a compile keeps about one core
busy). The markdown file is rewritten after every row, and the results kept beside it
(`tpu_aot.md.json`): run the same command again and it compiles only the rows still missing.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time

GB = 10 ** 9


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation's per-chip peaks, from Google's Cloud TPU pages (docs.cloud.google.com/tpu/
  docs/v5e, v5p, v6e): bf16 FLOP/s, HBM bytes (the pages' GB, 10^9 bytes) and HBM bytes/s."""
  name: str
  peak_flops: float
  hbm_bytes: int
  hbm_bandwidth: float
  chips_per_core_count: int  # accelerator types count TensorCores: v5p-8 is 4 chips


CHIPS = {
    "v5e": Chip("TPU v5e", 197e12, 16 * GB, 819e9, 1),
    "v5p": Chip("TPU v5p", 459e12, 95 * GB, 2765e9, 2),
    "v6e": Chip("TPU v6e", 918e12, 32 * GB, 1638e9, 1),
}

# Slice shapes of an accelerator type "<gen>-<cores>" (Google's tables: v5e/v6e 2-D, v5p 3-D).
SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
             256: "4x8x8", 512: "8x8x8"}


def libtpu_missing() -> str | None:
  """Why TPU compiles cannot run here (None when libtpu is installed)."""
  if importlib.util.find_spec("libtpu") is None:
    return 'libtpu is not installed: pip install "lineax-lm[tpu_aot]" (it compiles for TPUs on any host)'
  return None


def parse_topology(topology: str) -> tuple[str, str]:
  """("v5p", "4x4x4") from "v5p:4x4x4" or the accelerator type "v5p-128"; a clear ValueError
  naming the value otherwise."""
  m = re.fullmatch(r"(v5e|v5p|v6e)(?::(\d+(?:x\d+){1,2})|-(\d+))", topology)
  if m is None:
    raise ValueError(f"unknown TPU topology {topology!r}: write <chip>:<shape> (v5e:2x4, v6e:4x4, "
                     f"v5p:4x4x4) or an accelerator type (v5e-8, v5p-64); chips: {sorted(CHIPS)}")
  gen, shape, cores = m.groups()
  if shape is None:
    chips, rem = divmod(int(cores), CHIPS[gen].chips_per_core_count)
    shapes = SHAPES_3D if gen == "v5p" else SHAPES_2D
    if rem or chips not in shapes:
      raise ValueError(f"unknown TPU topology {topology!r}: {gen} slices come in "
                       f"{[n * CHIPS[gen].chips_per_core_count for n in shapes]} cores")
    shape = shapes[chips]
  dims = shape.split("x")
  if (gen == "v5p") != (len(dims) == 3):
    raise ValueError(f"TPU topology {topology!r}: {gen} slices are {'3' if gen == 'v5p' else '2'}-D")
  return gen, shape


def topology_devices(topology: str):
  """(chip, devices) of a TPU slice named as in `parse_topology`, through libtpu."""
  gen, shape = parse_topology(topology)
  if (why := libtpu_missing()):
    raise RuntimeError(f"--aot={topology}: {why}")
  # Compiling touches no TPU, so processes need not take turns on libtpu's lockfile (pytest workers,
  # the matrix's child processes).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  n = math.prod(int(d) for d in shape.split("x"))
  # One-chip slices are one host of one chip (libtpu's default host is 2x2x1).
  kw = dict(chips_per_host_bounds=(1, 1, 1)) if n == 1 else {}
  desc = topologies.get_topology_desc(platform="tpu", topology_name=f"{gen}:{shape}", **kw)
  return CHIPS[gen], list(desc.devices)


# --- the kernel matrix ----------------------------------------------------------------------------

ANCHOR = dict(B=4, T=4096, H=16, K=128, V=128)
# Per-family (H, K, V) of the 340M and 1.3B presets' mixers (lineax_lm.models.presets; tests check
# these against the models) where they differ from the anchor's K = V = 128; HGRN is elementwise
# over D = H * V.
PRESET_DIMS = {
    "gla": [(4, 128, 256), (4, 256, 512)],
    "simple_gla": [(4, 128, 256), (4, 256, 512)],
    "retention": [(8, 128, 256), (8, 256, 512)],
    "rwkv6": [(4, 128, 256), (8, 128, 256)],
    "gated_delta_rule": [(2, 256, 512), (4, 256, 512)],
    "mlstm": [(4, 512, 512), (4, 1024, 1024)],
    "hgrn": [(8, 128, 128)],
}
FAMILIES = ("gla", "simple_gla", "retention", "linear_attn", "rwkv6", "gated_delta_rule",
            "delta_rule", "kda", "hgrn", "mlstm")
CONTEXT = 4  # chips on the context axis in the context-parallel rows
KINDS = ("anchor", "varlen", "context", "float32", "preset", "forward")


@dataclasses.dataclass(frozen=True)
class Item:
  family: str
  chip: str
  B: int
  T: int
  H: int
  K: int
  V: int
  dtype: str = "bfloat16"
  varlen: bool = False
  grad: bool = True
  context: int = 1

  @property
  def label(self) -> str:
    parts = [f"H={self.H} K={self.K} V={self.V}", self.dtype, "fwd+bwd" if self.grad else "fwd"]
    if self.varlen:
      parts.append(f"varlen ({self.B} seqs)")
    if self.context > 1:
      parts.append(f"context {self.context} chips")
    return ", ".join(parts)


def matrix(chips=tuple(CHIPS), families=FAMILIES, kinds=KINDS) -> list[Item]:
  """The items in the order they run: the anchor forward+backward of every family on every chip
  first, then varlen, context-parallel, float32, the presets' head dims, forward alone."""
  items = []
  for kind in kinds:
    for chip in chips:
      for f in families:
        base = Item(f, chip, **ANCHOR)
        if kind == "anchor":
          items.append(base)
        elif kind == "varlen":
          items.append(dataclasses.replace(base, varlen=True))
        elif kind == "context":
          items.append(dataclasses.replace(base, context=CONTEXT))
        elif kind == "float32":
          items.append(dataclasses.replace(base, dtype="float32"))
        elif kind == "preset":
          items += [dataclasses.replace(base, H=H, K=K, V=V) for H, K, V in PRESET_DIMS.get(f, [])]
        elif kind == "forward":
          items.append(dataclasses.replace(base, grad=False))
  return items


def _op_inputs(item: Item):
  """(chunk op, positional input shapes and dtypes): [B, T, ...] tensors, then per-head ones."""
  import jax.numpy as jnp
  from pallas_kernels import (delta_rule, gated_delta_rule, gla, hgrn, kda, linear_attn, mlstm,
                              retention, rwkv6, simple_gla)
  B, T, H, K, V = item.B, item.T, item.H, item.K, item.V
  x, f32 = jnp.dtype(item.dtype), jnp.float32
  qkv = [((B, T, H, K), x), ((B, T, H, K), x), ((B, T, H, V), x)]
  head_gate, channel_gate = ((B, T, H), f32), ((B, T, H, K), f32)
  return {
      "gla": (gla.chunk_gla, qkv + [channel_gate]),
      "simple_gla": (simple_gla.chunk_simple_gla, qkv + [head_gate]),
      "retention": (retention.chunk_retention, qkv),
      "linear_attn": (linear_attn.chunk_linear_attn, qkv),
      "rwkv6": (rwkv6.chunk_rwkv6, qkv + [channel_gate, ((H, K), f32)]),
      "gated_delta_rule": (gated_delta_rule.chunk_gated_delta_rule, qkv + [head_gate, head_gate]),
      "delta_rule": (delta_rule.chunk_delta_rule, qkv + [head_gate]),
      "kda": (kda.chunk_kda, qkv + [channel_gate, head_gate]),
      "hgrn": (hgrn.chunk_hgrn, [((B, T, H * V), x), ((B, T, H * V), f32)]),
      "mlstm": (mlstm.chunk_mlstm, qkv + [head_gate, head_gate]),
  }[item.family]


def compile_item(item: Item) -> dict:
  """Compiles `item` for its chip; {compile_s, temp_bytes, flops}."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  op, shapes = _op_inputs(item)
  _, devices = topology_devices(f"{item.chip}:{'2x2x1' if item.chip == 'v5p' else '2x2'}")
  mesh = Mesh(devices[:item.context], ("context",))
  B, T = (1, item.B * item.T) if item.varlen else (item.B, item.T)
  shapes = [((B, T) + s[2:], d) if len(s) > 2 else (s, d) for s, d in shapes]
  time_spec = lambda s: P(None, "context") if len(s) > 2 else P()
  args = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, time_spec(s))) for s, d in shapes]
  cu = None
  if item.varlen:  # item.B sequences of item.T tokens, packed (global offsets under context)
    cu = jnp.arange(item.B + 1, dtype=jnp.int32) * item.T
  context_axis = "context" if item.context > 1 else None

  def local(*xs):
    return op(*xs, cu_seqlens=cu, backend="tpu", context_axis=context_axis)[0]

  def forward(*xs):
    if context_axis is None:
      return local(*xs)
    specs = tuple(time_spec(s) for s, _ in shapes)
    # a pallas_call's outputs carry no varying-axes type, so the check is off (as for GPU kernels)
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=time_spec(shapes[0][0]),
                         check_vma=False)(*xs)

  fn = forward
  if item.grad:
    fn = jax.grad(lambda *xs: forward(*xs).astype(jnp.float32).sum(), argnums=tuple(range(len(args))))
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  seconds = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return dict(compile_s=seconds, temp_bytes=compiled.memory_analysis().temp_size_in_bytes,
              flops=float(cost.get("flops", 0.0)))


def run_isolated(item: Item, timeout: float) -> dict:
  """`compile_item` in a child process: {"compile_s", ...} or {"error": why} ("timeout" past
  `timeout` seconds)."""
  cmd = [sys.executable, "-m", "pallas_kernels.tpu_aot", "--item", json.dumps(dataclasses.asdict(item))]
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    return {"error": f"timeout (> {timeout:.0f} s)"}
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode or not lines:
    errors = [l for l in done.stderr.splitlines() if re.match(r"[\w.]*(Error|Exception)\b", l)]
    return {"error": errors[-1][:300] if errors else f"exit {done.returncode}, no error line"}
  return json.loads(lines[-1])


def table(rows: list[tuple[Item, dict | None]]) -> str:
  """The markdown table: one row per item, pending ones marked."""
  out = ["| family | chip | shape | compile s | temp MiB | GFLOPs |", "|---|---|---|---:|---:|---:|"]
  for item, r in rows:
    if r is None:
      cells = ["not run", "", ""]
    elif "error" in r:
      cells = [r["error"].replace("|", "/"), "", ""]
    else:
      cells = [f"{r['compile_s']:.1f}", f"{r['temp_bytes'] / 2 ** 20:.0f}", f"{r['flops'] / 1e9:.1f}"]
    out.append(f"| {item.family} | {item.chip} | {item.label} | " + " | ".join(cells) + " |")
  return "\n".join(out) + "\n"


def fill_table(keys, run_one, render, out: str | None = None, jobs: int = 1) -> str:
  """`run_one(key)` for each key, `jobs` at a time (each runs a child process), printing each row as
  it finishes and rewriting the markdown file `out` (`render([(key, result or None), ...])` in the
  keys' order, rows not yet run as None) after every one; returns the whole table.

  The results also go to `out` + ".json" (a row's key is its `repr`), and a later run with the same
  `out` keeps the rows that compiled there instead of compiling them again, so a table of hours
  fills over several runs and a run cut short loses only the rows it was compiling. Errors and
  timeouts run again."""
  rows = [(key, None) for key in keys]
  done = {}
  if out and os.path.exists(out + ".json"):
    with open(out + ".json") as f:
      done = {k: r for k, r in json.load(f).items() if "error" not in r}
  todo = []
  for i, key in enumerate(keys):
    if repr(key) in done:
      rows[i] = (key, done[repr(key)])
    else:
      todo.append(i)
  if len(todo) < len(keys):
    print(f"{len(keys) - len(todo)} rows kept from {out}.json (delete it to compile them again)",
          flush=True)

  def record(i, result):
    rows[i] = (keys[i], result)
    done[repr(keys[i])] = result
    print(render([rows[i]]).splitlines()[-1], flush=True)
    if out:
      with open(out, "w") as f:
        f.write(render(rows))
      with open(out + ".json", "w") as f:
        json.dump(done, f, indent=1)

  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    futures = {pool.submit(run_one, keys[i]): i for i in todo}
    for future in concurrent.futures.as_completed(futures):
      record(futures[future], future.result())
  return render(rows)


def define_flags(fv, argv) -> None:
  from absl import flags
  del argv
  flags.DEFINE_list("chips", list(CHIPS), f"subset of {sorted(CHIPS)}", flag_values=fv)
  flags.DEFINE_list("families", list(FAMILIES), "subset of the op families", flag_values=fv)
  flags.DEFINE_list("only", list(KINDS), f"row kinds, of {list(KINDS)}", flag_values=fv)
  flags.DEFINE_float("timeout", 600.0, "seconds per compile", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("jobs", 1, "compiles at a time (one process and about one core each)",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_string("out", None, "markdown file, rewritten after every row", flag_values=fv)
  flags.DEFINE_string("item", None, "internal: one item (JSON), compiled in a child process",
                      flag_values=fv)


def main(argv=None):
  """python -m pallas_kernels.tpu_aot [--chips ..] [--families ..] [--only ..] [--out FILE]."""
  # The command line follows the distribution's convention (absl flags, one-line errors); the
  # kernels themselves import nothing but jax.
  from lineax_lm import cli
  a = cli.parse(define_flags, argv, "python -m pallas_kernels.tpu_aot", __doc__)
  if a.item:
    print(json.dumps(compile_item(Item(**json.loads(a.item)))), flush=True)
    return
  for name, values, known in (("--chips", a.chips, CHIPS), ("--families", a.families, FAMILIES),
                              ("--only", a.only, KINDS)):
    if (bad := sorted(set(values) - set(known))):
      cli.fail(f"{name}: unknown {bad}; choose from {sorted(known)}")
  if (why := libtpu_missing()):
    cli.fail(why)
  items = matrix(a.chips, a.families, a.only)
  print(fill_table(items, lambda item: run_isolated(item, a.timeout), table, a.out, a.jobs))

if __name__ == "__main__":
  main()
