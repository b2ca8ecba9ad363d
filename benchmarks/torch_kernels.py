"""The device-busy time of a torch step and its per-kernel table, from a torch.profiler trace: the
torch side of the per-op profiles that benchmarks/train_step.py (jax.profiler) and
benchmarks/ops.py print for our code, so the two can be read kernel against kernel."""
from __future__ import annotations


def busy_ms(step, table_path: str, steps: int = 20) -> float:
  """Runs step() `steps` times under torch.profiler: summed CUDA kernel time per step; the
  per-kernel table (ms a step, calls a step, kernel name; longest first) goes to table_path."""
  import torch
  from torch.profiler import ProfilerActivity, profile
  with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(steps):
      step()
    torch.cuda.synchronize()
  kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
  total = sum(e.device_time_total for e in kernels) / 1e3 / steps
  with open(table_path, "w") as f:
    f.write(f"device busy {total:.2f} ms a step ({steps} steps)\n")
    for e in sorted(kernels, key=lambda e: -e.device_time_total):
      f.write(f"{e.device_time_total / 1e3 / steps:8.3f} ms/step  {e.count // steps:3d}x  {e.key[:110]}\n")
  return total
