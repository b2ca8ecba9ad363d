"""Forward and forward+backward times of every op on the current device, as a table.

    python -m pallas_kernels.bench                      # every op, xla path, a size that fits the device
    python -m pallas_kernels.bench --backends xla,gpu --B 4 --T 4096 --H 16 --K 128 --V 128

Defaults: the anchor shape of docs/DESIGN.md (B=4, T=4096, H=16, K=V=128, bf16 inputs,
float32 gates) on an accelerator, a small shape (B=2, T=1024, H=4, K=V=64) on CPU. Median of
`--iters` timed calls after two warm-ups; fwd+bwd is the gradient of sum(o * do) w.r.t. every input.
"""
from __future__ import annotations

import argparse
import importlib
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

# op -> (family, chunk function, argument names). Inputs are drawn by `make_inputs`.
OPS = {
    "linear_attn": ("linear_attn", "chunk_linear_attn", ("q", "k", "v")),
    "retention": ("retention", "chunk_retention", ("q", "k", "v")),
    "simple_gla": ("simple_gla", "chunk_simple_gla", ("q", "k", "v", "gs")),
    "gla": ("gla", "chunk_gla", ("q", "k", "v", "gk")),
    "rwkv6": ("rwkv6", "chunk_rwkv6", ("q", "k", "v", "gk", "u")),
    "delta_rule": ("delta_rule", "chunk_delta_rule", ("q", "kn", "v", "beta")),
    "gated_delta_rule": ("gated_delta_rule", "chunk_gated_delta_rule", ("q", "kn", "v", "gs", "beta")),
    "kda": ("kda", "chunk_kda", ("q", "kn", "v", "gk", "beta")),
    "hgrn": ("hgrn", "chunk_hgrn", ("x", "gx")),
    "mlstm": ("mlstm", "chunk_mlstm", ("q", "k", "v", "i", "f")),
}
# options each op is timed with: fla's benchmark times linear attention without its normalizer
OPTIONS = {"linear_attn": {"normalize": False}}


def op_of(name):
  """(the public chunk op of OPS[name] with its OPTIONS, its argument names)."""
  family, fn_name, argnames = OPS[name]
  op = getattr(importlib.import_module(f"pallas_kernels.{family}"), fn_name)
  options = OPTIONS.get(name, {})
  return (lambda *a, **kw: op(*a, **options, **kw)), argnames


def make_inputs(B, T, H, K, V, dtype, seed=0):
  """Inputs as in fla's benchmark: unit-norm keys for the delta rules, log-sigmoid gates (float32)."""
  rng = np.random.default_rng(seed)
  r = lambda *s: rng.standard_normal(s, dtype=np.float32)
  logsig = lambda x: -np.logaddexp(0.0, -x)
  kn = r(B, T, H, K)
  d = dict(q=r(B, T, H, K), k=r(B, T, H, K), kn=kn / np.linalg.norm(kn, axis=-1, keepdims=True),
           v=r(B, T, H, V), x=r(B, T, H * K))
  d = {n: jnp.asarray(x, dtype) for n, x in d.items()}
  d.update(gs=logsig(r(B, T, H) + 3.0), gk=logsig(r(B, T, H, K) + 3.0) / 4,
           beta=1 / (1 + np.exp(-r(B, T, H))), u=0.1 * r(H, K), i=r(B, T, H), f=r(B, T, H) + 3.0,
           gx=logsig(r(B, T, H * K) + 3.0))
  return {n: jnp.asarray(x) for n, x in d.items()}


def median_ms(fn, *args, iters=20):
  for _ in range(2):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times) * 1e3)


def time_op(name, backend, inputs, iters):
  op, argnames = op_of(name)
  args = tuple(inputs[a] for a in argnames)
  fwd = jax.jit(lambda *a: op(*a, backend=backend)[0])
  o = fwd(*args)
  do = jnp.asarray(np.random.default_rng(1).standard_normal(o.shape, dtype=np.float32), o.dtype)
  grad = jax.jit(jax.grad(lambda *a: jnp.sum(op(*a, backend=backend)[0].astype(jnp.float32) * do),
                          argnums=tuple(range(len(args)))))
  return median_ms(fwd, *args, iters=iters), median_ms(grad, *args, iters=iters)


def main(argv=None):
  on_cpu = jax.default_backend() == "cpu"
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ops", default=",".join(OPS))
  p.add_argument("--backends", default="xla")
  p.add_argument("--B", type=int, default=2 if on_cpu else 4)
  p.add_argument("--T", type=int, default=1024 if on_cpu else 4096)
  p.add_argument("--H", type=int, default=4 if on_cpu else 16)
  p.add_argument("--K", type=int, default=64 if on_cpu else 128)
  p.add_argument("--V", type=int, default=64 if on_cpu else 128)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--iters", type=int, default=5 if on_cpu else 30)
  p.add_argument("--json", help="also write the results to this file")
  a = p.parse_args(argv)
  inputs = make_inputs(a.B, a.T, a.H, a.K, a.V, jnp.dtype(a.dtype))
  tokens = a.B * a.T
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
        f"B={a.B} T={a.T} H={a.H} K={a.K} V={a.V} {a.dtype}")
  rows = []
  for name in a.ops.split(","):
    for backend in a.backends.split(","):
      try:
        fwd, fb = time_op(name, backend, inputs, a.iters)
        rows.append(dict(op=name, backend=backend, fwd_ms=fwd, fwdbwd_ms=fb,
                         fwdbwd_Mtok_s=tokens / fb / 1e3))
      except (ModuleNotFoundError, ValueError) as e:
        rows.append(dict(op=name, backend=backend, error=str(e).splitlines()[0][:70]))
  print("\n| op | backend | fwd ms | fwd+bwd ms | fwd+bwd Mtok/s |\n|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['op']} | {r['backend']} | - | - | {r['error']} |")
    else:
      print(f"| {r['op']} | {r['backend']} | {r['fwd_ms']:.2f} | {r['fwdbwd_ms']:.2f} | {r['fwdbwd_Mtok_s']:.2f} |")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(dict(shape=vars(a), rows=rows), f, indent=1)
  return rows


if __name__ == "__main__":
  main()
