"""The train step of a config compiled for a TPU slice that is not here, before anyone rents it.

    python -m lineax_lm.train --config configs/lm.py:gated_deltanet_1.3b --aot=v5p:4x4x4

libtpu (the `tpu_aot` extra) lays out the slice's devices (`pallas_kernels.tpu_aot.topology_devices`);
the config's mesh (data, fsdp, context, tensor) is built over them, and the real step (model, AdamW,
loss, sharding constraints, the TPU kernels that `backend="auto"` takes on a TPU) is lowered from
abstract state and batch and compiled by the TPU compiler, as MaxText's train_compile.py does.
Nothing runs. The report: per-chip HBM (state, batch and temporaries, from `memory_analysis`)
against the chip's capacity, the compile time, the FLOPs a step costs a chip (counted from the
step's jaxpr, `lineax_lm.train.flops`: XLA's `cost_analysis` counts a loop's body once, so a scan
over the layers would show a fraction of them), and a roofline estimate of the step time (the larger
of FLOPs / peak FLOP/s and XLA's HBM bytes / bandwidth) with the tokens/s per chip and MFU it
implies.
The peaks are `pallas_kernels.tpu_aot.CHIPS` (Google's Cloud TPU pages).

A config that does not fit raises `DoesNotFit`, naming the topology, the mesh and the bytes, with
the settings that shard or drop what takes the room.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

from lineax_lm import sharding
from lineax_lm.train.flops import jaxpr_flops
from lineax_lm.train.trainer import Trainer, validate_config
from pallas_kernels.tpu_aot import Chip, fill_table, topology_devices

GIB = 2 ** 30


class DoesNotFit(ValueError):
  """The compiled step needs more HBM per chip than the chip has."""


@dataclasses.dataclass
class Report:
  topology: str
  chip: Chip
  mesh: dict
  num_params: int
  tokens_per_step: int
  compile_s: float
  state_bytes: int      # per chip: parameters, optimizer state (the donated step input)
  batch_bytes: int
  temp_bytes: int       # per chip: activations and everything else the step allocates
  flops: float          # per chip, per step: counted from the jaxpr (lineax_lm.train.flops)
  bytes_accessed: float  # per chip, per step: HBM traffic XLA estimates (a loop's body once)

  @property
  def hbm_bytes(self) -> int:
    """Per-chip peak: the state (updated in place: donated), the batch and the temporaries."""
    return self.state_bytes + self.batch_bytes + self.temp_bytes

  @property
  def fits(self) -> bool:
    return self.hbm_bytes <= self.chip.hbm_bytes

  @property
  def chips(self) -> int:
    return math.prod(self.mesh.values())

  @property
  def model_flops(self) -> float:
    """6 N FLOPs a token, per chip (the trainer's MFU convention)."""
    return 6 * self.num_params * self.tokens_per_step / self.chips

  @property
  def step_s(self) -> float:
    """Roofline: the step takes at least its FLOPs at peak and its HBM traffic at full bandwidth."""
    return max(self.flops / self.chip.peak_flops, self.bytes_accessed / self.chip.hbm_bandwidth)

  @property
  def tokens_per_s_per_chip(self) -> float:
    return self.tokens_per_step / self.step_s / self.chips

  @property
  def mfu(self) -> float:
    """6 N FLOPs a token (the trainer's MFU) at the roofline step time: below 1 by the work
    beyond 6 N (the recomputed forward of `remat`, attention's and the mixers' own)."""
    return self.model_flops / (self.step_s * self.chip.peak_flops)

  def lines(self) -> list[str]:
    g = lambda b: f"{b / GIB:.2f} GiB"
    return [
        f"topology {self.topology}: {self.chips} x {self.chip.name}, mesh {self.mesh}",
        f"model {self.num_params / 1e6:.1f}M parameters, {self.tokens_per_step:,} tokens a step",
        f"compile {self.compile_s:.1f} s",
        f"HBM per chip {g(self.hbm_bytes)} of {g(self.chip.hbm_bytes)} "
        f"({'fits' if self.fits else 'DOES NOT FIT'}): state {g(self.state_bytes)}, "
        f"batch {g(self.batch_bytes)}, temporaries {g(self.temp_bytes)}",
        f"per chip per step: {self.flops:.3e} FLOPs (counted from the program; 6 N a token: "
        f"{self.model_flops:.3e}), {self.bytes_accessed:.3e} HBM bytes (XLA's: a loop's body once)",
        f"roofline (peaks {self.chip.peak_flops / 1e12:.0f} TFLOP/s bf16, "
        f"{self.chip.hbm_bandwidth / 1e9:.0f} GB/s): step >= {self.step_s * 1e3:.1f} ms, "
        f"<= {self.tokens_per_s_per_chip:,.0f} tokens/s per chip, MFU <= {self.mfu:.1%}",
    ]


def abstract_batch(config, mesh_sharding) -> dict:
  """The step's batch as ShapeDtypeStructs: int32 [global batch, seq_len] (packed text also has
  segment_ids and positions; see lineax_lm.data.pipeline)."""
  keys = ["inputs", "targets", "loss_mask"]
  if config.data.source != "mqar" and config.data.get("packing", "none") != "none":
    keys += ["segment_ids", "positions"]
  shape = (config.data.global_batch_size, config.data.seq_len)
  return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=mesh_sharding) for k in keys}


def _per_chip(tree) -> int:
  """Bytes one chip holds of a tree of sharded ShapeDtypeStructs."""
  total = 0
  for x in jax.tree_util.tree_leaves(tree):
    shard = x.sharding.shard_shape(x.shape)
    total += math.prod(shard) * jnp.dtype(x.dtype).itemsize
  return total


def suggestions(config, report: Report) -> list[str]:
  """Settings that shrink what takes the room, largest share first."""
  mesh, n = report.mesh, report.chips
  out = []
  if mesh["fsdp"] < n // (mesh["context"] * mesh["tensor"]):
    out.append(f"--config.mesh.fsdp=-1 --config.mesh.data=1 (shards the {report.state_bytes / GIB:.1f} "
               f"GiB of parameters and optimizer state a chip holds over the data chips too)")
  if config.model.get("remat") in (None, "none", "dots", "dots_no_batch"):
    out.append(f"--config.model.remat=full (keeps only each layer's input for the backward; "
               f"temporaries are {report.temp_bytes / GIB:.1f} GiB a chip now)")
  if config.model.get("scan_layers"):
    out.append("--config.model.scan_layers=False (unrolled layers often hold less, for twice the "
               "compile time: gla_340m on v5p-8 15.2 GiB a chip against 21.5 scanned; not always: "
               "the 340M GDN hybrid on v5e-8 needs 17.9 GiB of temporaries unrolled, 15.7 GiB in "
               "all scanned)")
  accum = config.train.grad_accum
  if (config.data.global_batch_size // accum) % (2 * mesh["data"] * mesh["fsdp"]) == 0:
    out.append(f"--config.train.grad_accum={2 * accum} (half the activations at a time)")
  return out


def compile_step(config, topology: str) -> Report:
  """Compiles `config`'s train step for `topology` (e.g. "v5p:4x4x4", "v5e-8"); the Report."""
  chip, devices = topology_devices(topology)
  try:
    mesh = sharding.make_mesh(config.mesh, devices=devices)
  except ValueError as e:
    raise ValueError(f"--aot={topology} ({len(devices)} chips): {e}") from None
  model_cfg = validate_config(config, mesh)
  if model_cfg.backend == "auto":  # what "auto" takes on a TPU host (this one is a CPU)
    model_cfg = dataclasses.replace(model_cfg, backend="tpu")
  trainer = Trainer(config, model_cfg, mesh)
  state, batch = trainer.abstract_state(), abstract_batch(config, trainer.batch_sharding)
  step = trainer.train_step.func  # the jitted step (train_step binds the objective's extra)
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    traced = step.trace(state, batch, extra=None)
    lowered = traced.lower()
  flops = step_flops(config, model_cfg, mesh, traced, state, batch)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:  # the TPU compiler's own out-of-memory verdict
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    raise DoesNotFit(f"--aot={topology}: the step does not fit on mesh {dict(mesh.shape)} "
                     f"({chip.name}, {chip.hbm_bytes / GIB:.2f} GiB a chip): {e}") from None
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  memory = compiled.memory_analysis()
  return Report(
      topology=topology, chip=chip, mesh=dict(mesh.shape), num_params=trainer.num_params,
      tokens_per_step=config.data.global_batch_size * config.data.seq_len, compile_s=compile_s,
      state_bytes=_per_chip(state), batch_bytes=_per_chip(batch), temp_bytes=memory.temp_size_in_bytes,
      flops=flops / math.prod(mesh.shape.values()),
      bytes_accessed=float(cost.get("bytes accessed", 0.0)))


def step_flops(config, model_cfg, mesh, traced, state, batch) -> float:
  """The whole mesh's FLOPs of a step (`jaxpr_flops` of its trace). The splash-attention kernel
  declares no cost, so where the step has attention its FLOPs come from the same step traced with
  XLA's attention (dense: the masked half of causal attention that splash skips is counted too)."""
  if model_cfg.attn_impl == "xla" or not model_cfg.attention_indices:
    return jaxpr_flops(traced.jaxpr)
  counting = Trainer(config, dataclasses.replace(model_cfg, attn_impl="xla"), mesh)
  with jax.set_mesh(mesh):
    return jaxpr_flops(counting.train_step.func.trace(state, batch, extra=None).jaxpr)


def check(config, topology: str) -> Report:
  """`compile_step`, raising DoesNotFit (mesh, bytes, suggestions) when the step does not fit."""
  return raise_if_too_big(config, compile_step(config, topology))


def raise_if_too_big(config, report: Report) -> Report:
  """`report` when its step fits the chip; else DoesNotFit naming the topology, mesh and bytes."""
  if not report.fits:
    hints = "; ".join(suggestions(config, report)) or "a larger slice"
    raise DoesNotFit(
        f"--aot={report.topology}: the step needs {report.hbm_bytes / GIB:.2f} GiB per chip "
        f"(state {report.state_bytes / GIB:.2f}, batch {report.batch_bytes / GIB:.2f}, temporaries "
        f"{report.temp_bytes / GIB:.2f}) on mesh {report.mesh}, above the {report.chip.name}'s "
        f"{report.chip.hbm_bytes / GIB:.2f} GiB; try {hints}")
  return report


def main(config, topology: str) -> int:
  """The --aot entry point: prints the report; 1 (with the reason) when the step does not fit, 2
  for a topology or mesh that is wrong."""
  if "JAX_PLATFORMS" not in os.environ:  # compiling needs no TPU; spare jax its search for one
    jax.config.update("jax_platforms", "cpu")
  try:
    report = check(config, topology)
  except DoesNotFit as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except (ValueError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("\n".join(report.lines()))
  return 0


# --- the presets x topologies table -------------------------------------------------------------

# (preset, topology, overrides): the 340M and 1.3B presets of four mixers, pure and 3:1 hybrid, and
# the Transformer, on the slices people rent, at T=4096 and 0.5M tokens a step (the papers' batch);
# last, one long-context row with the sequence split over a context axis (1M tokens a step: the
# batch must divide over the 8 fsdp chips).
TABLE_PRESETS = [f"{m}{h}_{s}" for s in ("340m", "1.3b")
                 for m in ("gated_deltanet", "gla", "hgrn2", "kda") for h in ("", "_hybrid")]
TABLE_PRESETS += ["transformer_340m", "transformer_1.3b"]
TABLE_TOPOLOGIES = ["v5e-8", "v5p-8", "v6e-8", "v5p-64", "v5p-128"]
# bf16 compute on float32 parameters, FSDP over every chip, each layer's activations recomputed in
# the backward; the layers as a scan, which compiles the repeating block once instead of 24 times
# (half the compile time; unrolled layers often, not always, hold less: a row that misses names
# them among its suggestions).
COMMON_SETTINGS = ["--config.train.tokens=10_000_000_000", "--config.model.scan_layers=True",
                   "--config.model.dtype=bfloat16", "--config.model.remat=full", "--config.mesh.data=1"]
TABLE_SETTINGS = COMMON_SETTINGS + ["--config.mesh.fsdp=-1", "--config.data.seq_len=4096",
                                    "--config.data.global_batch_size=128"]
# a v5p-128 is 64 chips in 4-chip hosts; a context axis stays within one host (each process loads
# whole rows; sharding.make_mesh lays it so): context 4 (32,768 tokens a chip), FSDP over the other
# 16, a row per FSDP shard
LONG_CONTEXT = ("gated_deltanet_hybrid_1.3b", "v5p-128",
                COMMON_SETTINGS + ["--config.mesh.fsdp=16", "--config.mesh.context=4",
                                   "--config.data.seq_len=131072", "--config.data.global_batch_size=16"])


def table_rows():
  return [(p, t, TABLE_SETTINGS) for p in TABLE_PRESETS for t in TABLE_TOPOLOGIES] + [LONG_CONTEXT]


def run_row(preset: str, topology: str, overrides: list[str], timeout: float) -> dict:
  """One row through the real command line, in a child process under `timeout` seconds."""
  cmd = [sys.executable, "-m", "lineax_lm.train", f"--config=configs/lm.py:{preset}",
         f"--aot={topology}", *overrides]
  start = time.perf_counter()
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timeout (> {timeout:.0f} s)"}
  out = done.stdout + done.stderr
  if done.returncode == 1:  # does not fit: the per-chip need is in the message, ours or the TPU
    # compiler's own, which counts the temporaries alone (so the need is more than that)
    need = re.search(r"needs ([\d.]+) GiB per chip", out)
    temporaries = re.search(r"required for HLO temporaries \(([\d.]+)G\)", out)
    gib = need.group(1) if need else f"> {temporaries.group(1)}" if temporaries else "?"
    return {"fits": "no", "gib": gib, "compile_s": time.perf_counter() - start}
  if done.returncode:
    error = re.search(r"^(error:.*|\w*Error\b.*)", out, re.MULTILINE | re.DOTALL)
    return {"error": " ".join((error.group(1) if error else f"exit {done.returncode}").split())[:200]}
  get = lambda pattern: re.search(pattern, out).group(1)
  return {"fits": "yes", "gib": get(r"HBM per chip ([\d.]+) GiB"),
          "compile_s": float(get(r"compile ([\d.]+) s")),
          "tokens_s": get(r"<= ([\d,]+) tokens/s per chip"), "mfu": get(r"MFU <= ([\d.]+%)")}


def table_markdown(rows: list[tuple[tuple, dict | None]]) -> str:
  out = ["| preset | slice | T | fits | GiB / chip | compile s | tokens/s / chip (roofline) "
         "| MFU (roofline) |",
         "|---|---|---:|---|---:|---:|---:|---:|"]
  for (preset, topology, overrides), r in rows:
    T = next(o.split("=")[1] for o in overrides if o.startswith("--config.data.seq_len="))
    if r is None or "error" in r:
      cells = [r["error"].replace("|", "/") if r else "not run", "", "", "", ""]
    else:
      cells = [r["fits"], r["gib"], f"{r['compile_s']:.0f}", r.get("tokens_s", ""), r.get("mfu", "")]
    out.append(f"| {preset} | {topology} | {int(T):,} | " + " | ".join(cells) + " |")
  return "\n".join(out) + "\n"


def define_table_flags(fv, argv) -> None:
  from absl import flags
  del argv
  flags.DEFINE_string("out", None, "markdown file, rewritten after every row", flag_values=fv)
  flags.DEFINE_float("timeout", 1800.0, "seconds per row", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("jobs", 1, "rows compiled at a time (one process and about one core each)",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_list("presets", TABLE_PRESETS + [LONG_CONTEXT[0]], "subset of the rows' presets",
                    flag_values=fv)
  flags.DEFINE_list("topologies", TABLE_TOPOLOGIES, "subset of the rows' topologies", flag_values=fv)


def table_main(argv=None):
  """python -m lineax_lm.train.aot [--out FILE] [--timeout S] [--jobs N]: the presets x topologies
  table, one `python -m lineax_lm.train --aot` per row (N at a time), the file rewritten after each;
  the same command again compiles only the rows still missing (`pallas_kernels.tpu_aot.fill_table`)."""
  from lineax_lm import cli
  a = cli.parse(define_table_flags, argv, "python -m lineax_lm.train.aot", table_main.__doc__)
  rows = [r for r in table_rows() if r[0] in a.presets and r[1] in a.topologies]
  if not rows:
    cli.fail(f"no row has --presets {','.join(a.presets)} and --topologies {','.join(a.topologies)}")
  print(fill_table(rows, lambda row: run_row(*row, timeout=a.timeout), table_markdown, a.out,
                   a.jobs))


if __name__ == "__main__":
  table_main()
