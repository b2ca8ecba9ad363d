"""flash-linear-attention's side of the op benchmark (torch + fla 0.6.0 only; no JAX): forward and
forward+backward times and the peak memory of forward+backward of fla's chunked ops, for
benchmarks/ops.py to set beside ours as ratios from the same device call.

    python benchmarks/fla_ops.py --out DIR [--ops gla,kda,...] [--shapes 4x4096,8x8192] [--busy]
                                           # writes DIR/fla_ops.json

Inputs are drawn as pallas_kernels/bench.py's `make_inputs` draws ours: bf16 q, k, v (unit-norm keys
for the delta rules), float32 log-sigmoid gates, sigmoid beta; HGRN's x and g are [B, T, H * K].
Gradients are taken with respect to every input the op reads, gates included. Times are Triton's
`do_bench` medians; --busy adds the device-busy time (the summed CUDA kernel durations of a
torch.profiler trace, per step) and writes each op's per-kernel table: a step time well above its
busy time means the step waits on the host (Python, autograd, Triton's launcher), not the GPU.
fla autotunes every kernel on its first call on a fresh machine (minutes per family): keep Triton's
cache between calls (benchmarks/h200.sh does).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from torch_kernels import busy_ms

import fla.ops.common.chunk_o as _chunk_o

# fla refuses its gated backward kernels on Hopper with Triton < 3.7.1 (a Triton miscompile at some
# shapes). This is a timing script: correctness is checked against our float32 references, not fla.
_chunk_o.TRITON_ABOVE_3_7_1 = True
from fla.ops import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, chunk_kda,  # noqa: E402
                     chunk_linear_attn, chunk_retention, chunk_rwkv6, chunk_simple_gla)
from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn  # noqa: E402

# op -> (call on the inputs dict, names of the inputs it reads); names as in ops.py's rows.
OPS = {
    "linear_attn": (lambda d: chunk_linear_attn(d["q"], d["k"], d["v"], normalize=False), "q k v"),
    "retention": (lambda d: chunk_retention(d["q"], d["k"], d["v"]), "q k v"),
    "simple_gla": (lambda d: chunk_simple_gla(d["q"], d["k"], d["v"], g=d["gs"]), "q k v gs"),
    "gla": (lambda d: chunk_gla(d["q"], d["k"], d["v"], d["gk"]), "q k v gk"),
    "rwkv6": (lambda d: chunk_rwkv6(d["q"], d["k"], d["v"], d["gk"], d["u"]), "q k v gk u"),
    "delta_rule": (lambda d: chunk_delta_rule(d["q"], d["kn"], d["v"], d["beta"]), "q kn v beta"),
    "gated_delta_rule": (lambda d: chunk_gated_delta_rule(d["q"], d["kn"], d["v"], d["gs"], d["beta"]),
                         "q kn v gs beta"),
    "kda": (lambda d: chunk_kda(d["q"], d["kn"], d["v"], d["gk"], d["beta"]), "q kn v gk beta"),
    "hgrn": (lambda d: chunk_hgrn(d["x"], d["gx"]), "x gx"),
    "hgrn(fused_recurrent)": (lambda d: fused_recurrent_hgrn(d["x"], d["gx"]), "x gx"),
    "softmax_attn(torch sdpa)": (lambda d: F.scaled_dot_product_attention(
        d["qh"], d["kh"], d["vh"], is_causal=True), "qh kh vh"),
}


def make_inputs(B, T, H, K, V, seed=0):
  g = torch.Generator(device="cuda").manual_seed(seed)
  r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32, generator=g)
  bf = torch.bfloat16
  d = dict(q=r(B, T, H, K).to(bf), k=r(B, T, H, K).to(bf), kn=F.normalize(r(B, T, H, K), dim=-1).to(bf),
           v=r(B, T, H, V).to(bf), x=r(B, T, H * K).to(bf), gs=F.logsigmoid(r(B, T, H) + 3.0),
           gk=F.logsigmoid(r(B, T, H, K) + 3.0) / 4, beta=torch.sigmoid(r(B, T, H)), u=0.1 * r(H, K),
           gx=F.logsigmoid(r(B, T, H * K) + 3.0))
  d.update(qh=r(B, H, T, K).to(bf), kh=r(B, H, T, K).to(bf), vh=r(B, H, T, V).to(bf))
  return d


def measure(name, B, T, H, K, V, out_dir, busy=False):
  fn, names = OPS[name]
  d = make_inputs(B, T, H, K, V)
  used = [d[n].requires_grad_(True) for n in names.split()]
  first = lambda out: out[0] if isinstance(out, tuple) else out
  o = first(fn(d))
  do = torch.randn_like(o)
  step = lambda: torch.autograd.grad(first(fn(d)), used, do)
  step()  # autotunes on a fresh cache
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  step()
  torch.cuda.synchronize()
  r = dict(peak_GiB=round(torch.cuda.max_memory_allocated() / 2**30, 3),
           fwd_ms=do_bench(lambda: fn(d), warmup=25, rep=100, return_mode="median"),
           fwdbwd_ms=do_bench(step, warmup=25, rep=100, return_mode="median"))
  if busy:
    try:
      r["busy_ms"] = busy_ms(step, os.path.join(out_dir, f"fla_kernels_{name}_B{B}_T{T}.txt"))
    except Exception as e:  # the profiler's API moves between torch versions; the times stand
      r["busy_error"] = repr(e)[:200]
  del d, o, do, used
  torch.cuda.empty_cache()
  return r


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ops", default=",".join(OPS))
  p.add_argument("--shapes", default="4x4096,8x8192", help="BxT pairs")
  p.add_argument("--hkv", default="16,128,128", help="H,K,V (as benchmarks/ops.py's)")
  p.add_argument("--busy", action="store_true")
  p.add_argument("--out", default=os.environ.get("OUT", "."))
  a = p.parse_args()
  H, K, V = map(int, a.hkv.split(","))
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "fla_ops.json")
  res = dict(env=dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(0)), ops={})
  for name in filter(None, a.ops.split(",")):
    if name not in OPS:
      raise SystemExit(f"--ops: unknown op {name!r}; known: {', '.join(OPS)}")
    for shape in a.shapes.split(","):
      B, T = map(int, shape.split("x"))
      try:
        r = measure(name, B, T, H, K, V, a.out, a.busy)
      except Exception as e:  # one op's failure must not cost the others' figures
        r = dict(error=repr(e)[:300])
      res["ops"].setdefault(name, {})[f"{B}x{T}"] = r
      print(name, shape, r, flush=True)
      json.dump(res, open(path, "w"), indent=1)  # after every figure: a timeout keeps the rest


if __name__ == "__main__":
  main()
