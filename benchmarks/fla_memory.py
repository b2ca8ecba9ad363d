"""fla's peak device memory of forward+backward (and its fwd+bwd time at the length-scaling shapes),
for benchmarks/ops.py's ratios. Torch + flash-linear-attention only; run on the GPU host beside
../shared/bench/fla_ops_h200.py:

    RESULTS_DIR=DIR [ONLY=gated_delta_rule,...] [EXTRAS=1] python benchmarks/fla_memory.py
                                                         # writes DIR/fla_memory.json

Inputs as fla_ops_h200.py draws them (bf16 q, k, v; unit-norm k; float32 log-sigmoid gates and
sigmoid beta); EXTRAS=1 times GDN's fwd+bwd at the anchor shape and at T in LENGTHS (default
2048,8192,32768; 65,536 tokens per step), each with its device-busy time: the sum of the CUDA kernels'
durations in a torch.profiler trace, per step. Wall time well above busy time means the host
(Python, autograd, Triton's launcher) is what a step waits for, not the GPU.
Peak = torch.cuda.max_memory_allocated during one fwd+bwd (inputs, do and gradients
included), gradients with respect to every input.
"""
import json
import os

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import fla.ops.common.chunk_o as _co

_co.TRITON_ABOVE_3_7_1 = True  # as fla_ops_h200.py: timing only, the guard refuses gated bwd on Triton 3.6
from fla.ops import chunk_delta_rule, chunk_gated_delta_rule, chunk_simple_gla  # noqa: E402

OPS = {
    "gated_delta_rule": lambda d: chunk_gated_delta_rule(d["q"], d["k"], d["v"], d["gs"], d["beta"]),
    "delta_rule": lambda d: chunk_delta_rule(d["q"], d["k"], d["v"], d["beta"]),
    "simple_gla": lambda d: chunk_simple_gla(d["q"], d["k"], d["v"], g=d["gs"]),
}


def inputs(B, T, H, K, V, seed=0):
  g = torch.Generator(device="cuda").manual_seed(seed)
  r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32, generator=g)
  d = dict(q=r(B, T, H, K).bfloat16(), k=F.normalize(r(B, T, H, K), dim=-1).bfloat16(),
           v=r(B, T, H, V).bfloat16(), gs=F.logsigmoid(r(B, T, H) + 3.0), beta=torch.sigmoid(r(B, T, H)))
  for x in d.values():
    x.requires_grad_(True)
  return d


def device_busy_ms(step, steps=20, table_path=None):
  """Mean per step of the summed durations of the CUDA kernels that `step` launches; table_path:
  where to write the per-kernel table (fla's stages, to set beside ops.py --profile)."""
  with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(steps):
      step()
    torch.cuda.synchronize()
  kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
  if table_path:
    with open(table_path, "w") as f:
      for e in sorted(kernels, key=lambda e: -e.device_time_total):
        f.write(f"{e.device_time_total / 1e3 / steps:8.3f} ms/step  {e.count // steps:3d}x  {e.key[:110]}\n")
  return sum(e.device_time_total for e in kernels) / 1e3 / steps


def measure(name, B, T, H=16, K=128, V=128, timing=False):
  d = inputs(B, T, H, K, V)
  fn = OPS[name]
  o = fn(d)[0]
  do = torch.randn_like(o)
  used = [x for n, x in d.items() if n in ("q", "k", "v", "gs", "beta") and (name != "delta_rule" or n != "gs")
          and (name != "simple_gla" or n != "beta")]
  step = lambda: torch.autograd.grad(fn(d)[0], used, do)
  step()
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  step()
  torch.cuda.synchronize()
  r = dict(peak_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 3))
  if timing:
    r["fwdbwd_ms"] = do_bench(step, warmup=50, rep=200, return_mode="median")
    try:
      r["busy_ms"] = device_busy_ms(step, table_path=os.path.join(
          os.environ.get("RESULTS_DIR", "results"), f"fla_kernels_{name}_B{B}_T{T}.txt"))
    except Exception as e:  # the profiler's API moves between torch versions; the time above stands
      r["busy_error"] = repr(e)[:200]
  del d, o, do
  torch.cuda.empty_cache()
  return r


def main():
  out = os.environ.get("RESULTS_DIR", "results")
  os.makedirs(out, exist_ok=True)
  # fla_ops_h200.py's names may carry a note in brackets: "simple_gla(mamba2-like)"
  only = [n.split("(")[0] for n in os.environ.get("ONLY", ",".join(OPS)).split(",")]
  extras = os.environ.get("EXTRAS", "0") == "1"
  if extras:
    only.append("gated_delta_rule")  # the op EXTRAS times
  res = {}
  for name in OPS:
    if name in only:
      try:
        res[name] = {"4096": measure(name, 4, 4096, timing=extras and name == "gated_delta_rule")}
      except Exception as e:  # one op's failure must not cost the others' figures
        res[name] = {"4096": dict(error=repr(e)[:300])}
      print(name, res[name], flush=True)
  if extras:
    for T in map(int, os.environ.get("LENGTHS", "2048,8192,32768").split(",")):
      res["gated_delta_rule"][str(T)] = measure("gated_delta_rule", 65536 // T, T, timing=True)
      print(T, res["gated_delta_rule"][str(T)], flush=True)
  print(json.dumps(res))
  json.dump(res, open(os.path.join(out, "fla_memory.json"), "w"), indent=1)


if __name__ == "__main__":
  main()
