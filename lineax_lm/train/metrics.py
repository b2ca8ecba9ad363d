"""Training metrics: TensorBoard event files (tensorboardX, no TensorFlow), metrics.jsonl, and a
progress bar on a TTY (plain log lines otherwise)."""
from __future__ import annotations

import json
import logging
import os
import sys
import time

import jax
import numpy as np

from lineax_lm import storage

log = logging.getLogger("lineax_lm")

# Dense bf16 peak FLOP/s per device, for the MFU estimate (vendor datasheets).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
              "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v4": 275e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12}


def peak_flops_per_device() -> float | None:
  kind = jax.devices()[0].device_kind
  for name, flops in sorted(PEAK_FLOPS.items(), key=lambda kv: -len(kv[0])):
    if name.lower() in kind.lower():
      return flops
  return None


def device_memory_gib() -> float | None:
  stats = jax.local_devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use", stats.get("bytes_in_use"))
  return None if peak is None else peak / 2**30


def read_rows(path: str) -> list[dict]:
  """The rows of a metrics.jsonl file, [] when there is none. A row torn by a writer still at it (a
  run read while it trains) or by a kill in the middle of a write is left out."""
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except ValueError:  # blank, or torn
        continue
  return rows


def curve(rows: list[dict], name: str) -> tuple[list, list]:
  """(steps, values) of scalar `name` in metrics.jsonl `rows` (read_rows), leaving out the rows
  that do not log it (a metric logged every eval_every steps among every-log_every ones)."""
  points = [(r["step"], r[name]) for r in rows if name in r]
  return [s for s, _ in points], [v for _, v in points]


def drop_rows_after(path: str, step: int) -> int:
  """Removes the rows of metrics.jsonl `path` (a local file) past `step` (rewritten through a
  temporary file) and returns how many went. A run resumed from step `step` logs those steps again:
  a run killed after its last checkpoint, or rolled back to an earlier one, would otherwise list
  them twice."""
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = []
  for line in lines:
    try:
      row_step = json.loads(line).get("step", 0)
    except ValueError:  # a row torn by a kill in the middle of a write
      continue
    if row_step <= step:
      kept.append(line if line.endswith("\n") else line + "\n")
  if len(kept) < len(lines):
    with open(path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(path + ".tmp", path)
  return len(lines) - len(kept)


def in_notebook() -> bool:
  """True inside a Jupyter / Colab kernel (stderr is no TTY there, but tqdm.auto draws a widget)."""
  return "ipykernel" in sys.modules


class MetricsWriter:
  """Writes scalars to TensorBoard and metrics.jsonl (process 0 only) and shows progress. A run that
  trains on from `start_step` drops what an earlier run logged past it, so each step keeps one set
  of rows.

  The workdir may be local or on an object store (gs://...): the files are then written in a local
  staging folder and uploaded whole (storage.Staged) every `sync_every_s` seconds and at `close`,
  so tensorboardX and the appends to metrics.jsonl only ever see local files."""

  def __init__(self, workdir: str, total_steps: int, start_step: int = 0, enabled: bool | None = None,
               sync_every_s: float = 30.0):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.tb = None
    self.jsonl = None
    self.bar = None
    if not self.enabled:
      return
    from tensorboardX import SummaryWriter
    self.staged = storage.Staged(workdir, download=("metrics.jsonl",), min_interval_s=sync_every_s)
    path = os.path.join(self.staged.local, "metrics.jsonl")
    dropped = drop_rows_after(path, start_step) if start_step < total_steps else 0
    if dropped:
      log.info("dropped %d rows past step %d from %s (this run logs those steps again)", dropped,
               start_step, storage.join(workdir, "metrics.jsonl"))
    # purge_step: TensorBoard hides the earlier events at and past it, as metrics.jsonl drops them
    self.tb = SummaryWriter(os.path.join(self.staged.local, "tensorboard"),
                            purge_step=start_step + 1 if dropped else None)
    self.jsonl = open(path, "a")
    if sys.stderr.isatty() or in_notebook():
      from tqdm.auto import tqdm
      self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

  def write(self, step: int, scalars: dict):
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items() if v is not None and np.isscalar(np.asarray(v).item())}
    for name, value in scalars.items():
      self.tb.add_scalar(name, value, step)
    self.jsonl.write(json.dumps({"step": step, "time": time.time(), **scalars}) + "\n")
    self.jsonl.flush()
    short = {k: v for k, v in scalars.items()  # a training row's headline numbers, an eval row's all
             if k in ("loss", "grad_norm", "lr", "tokens_per_s", "mfu") or k.startswith("eval_")}
    if self.bar is not None:
      self.bar.set_postfix({k: f"{v:.4g}" for k, v in short.items()}, refresh=False)
    else:
      log.info("step %d  %s", step, "  ".join(f"{k}={v:.4g}" for k, v in short.items()))
    if self.staged.remote:
      self.tb.flush()
      self.staged.sync(force=False)

  def advance(self, n: int = 1):
    if self.bar is not None:
      self.bar.update(n)

  def close(self):
    if self.enabled:
      self.tb.close()
      self.jsonl.close()
      self.staged.close()
      if self.bar is not None:
        self.bar.close()


def profile_ops(trace_dir: str):
  """Device ops of the newest jax.profiler trace under `trace_dir`: ({op name: [total ns, calls,
  its first event's string stats (the HLO text or JAX op name where the profiler records them)]},
  busy ns, (first start ns, last end ns)), or (None, message) when there is no device trace."""
  import glob
  from jax.profiler import ProfileData
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
  if not paths:
    return None, f"(no trace under {trace_dir})"
  data = ProfileData.from_file(paths[-1])
  ops: dict[str, list] = {}
  busy_ns, first, last = 0.0, None, None
  for plane in data.planes:
    if not plane.name.startswith("/device:"):
      continue
    lines = list(plane.lines)
    # "XLA Ops" lists each HLO op once (the stream lines repeat them per kernel); fall back to all.
    lines = [l for l in lines if l.name == "XLA Ops"] or lines
    for line in lines:
      for e in line.events:
        t = ops.get(e.name)
        if t is None:
          stats = {k: v for k, v in dict(e.stats).items() if isinstance(v, str) and not k.startswith("_")}
          t = ops[e.name] = [0.0, 0, stats]
        t[0] += e.duration_ns
        t[1] += 1
        busy_ns += e.duration_ns
        first = e.start_ns if first is None else min(first, e.start_ns)
        last = e.end_ns if last is None else max(last, e.end_ns)
  if not ops:
    return None, f"(no device events in {paths[-1]}: a CPU run)"
  return ops, busy_ns, (first, last)


def profile_summary(trace_dir: str, steps: int, top: int = 15) -> str:
  """A markdown summary of the jax.profiler trace under `trace_dir` covering `steps` training steps:
  wall time per step, the device's busy time per step (kernels on the GPU / TPU planes; well below
  the wall time means the host is the bottleneck) and the `top` device ops by total time."""
  found = profile_ops(trace_dir)
  if found[0] is None:
    return found[1]
  ops, busy_ns, (first, last) = found
  wall_ms = (last - first) / 1e6 / steps
  rows = [f"device span per step {wall_ms:.1f} ms, kernels busy {busy_ns / 1e6 / steps:.1f} ms "
          f"({busy_ns / max(last - first, 1):.0%} of the span)", "",
          "| op | ms / step | share | calls / step |", "|---|---|---|---|"]
  for name, (ns, n, _) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
    rows.append(f"| {name[:80]} | {ns / 1e6 / steps:.2f} | {ns / busy_ns:.1%} | {n / steps:g} |")
  return "\n".join(rows)
