"""mLSTM's forward and forward+backward device times (ms), B=4 T=4096 H=16 K=V=128 bf16, by code
that runs in any tree of this repository: it calls `chunk_mlstm(q, k, v, i, f, backend="gpu")`,
whose signature every tree shares, and times `jax.grad` of sum(o * do) with respect to every input
as one program. For a bisect, each tree in its own process, the trees in alternating order:

    for R in 6addf01 60dbd6c; do git archive $R pallas_kernels | (mkdir -p ab_$R && tar x -C ab_$R); done
    for pass in 1 2; do for T in ab_6addf01 ab_60dbd6c .; do
      PYTHONPATH=$PWD/$T python3 benchmarks/time_mlstm.py $T; done; done

Env: MB_B, MB_T (batch, length), MB_N (calls a repetition; the best of five repetitions is kept),
MB_INTERPRET=1 (the kernels in interpret mode: a CPU check of the script, not a time), MB_STAGES=1
(also each kernel pass alone: `forward_pass`, `dstate_pass` and `dchunk_pass` jitted on the
arguments they get in one eager grad).
"""
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels
from pallas_kernels.mlstm import chunk_mlstm, gpu

B, T, H, K, V = int(os.environ.get("MB_B", 4)), int(os.environ.get("MB_T", 4096)), 16, 128, 128
rng = np.random.default_rng(0)
normal = lambda *shape: jnp.asarray(rng.standard_normal(shape) * 0.5, jnp.bfloat16)
q, k, v, do = normal(B, T, H, K), normal(B, T, H, K), normal(B, T, H, V), normal(B, T, H, V)
i = jnp.asarray(rng.standard_normal((B, T, H)), jnp.float32)
f = jnp.asarray(3.0 + rng.standard_normal((B, T, H)), jnp.float32)
INTERPRET = dict(interpret=True) if os.environ.get("MB_INTERPRET") else {}  # a CPU run, to check


def output(q, k, v, i, f):
  o = chunk_mlstm(q, k, v, i, f, backend="gpu", **INTERPRET)
  return o[0] if isinstance(o, tuple) else o


def loss(q, k, v, i, f, do):
  return jnp.sum(output(q, k, v, i, f).astype(jnp.float32) * do.astype(jnp.float32))


def device_ms(fn, *args, calls=int(os.environ.get("MB_N", 50))):
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(5):   # calls enqueued back to back: the host's dispatch hides behind the device
    start = time.perf_counter()
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / calls)
  return 1e3 * best


fwd = jax.jit(output)
grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
print(f"{sys.argv[1] if len(sys.argv) > 1 else '.'} ({pallas_kernels.__file__}) mlstm "
      f"fwd {device_ms(fwd, q, k, v, i, f):.3f} ms  grad {device_ms(grad, q, k, v, i, f, do):.3f} ms",
      flush=True)

if os.environ.get("MB_STAGES"):
  passes = ("forward_pass", "dstate_pass", "dchunk_pass")
  seen, kernels = {}, {name: getattr(gpu, name) for name in passes}

  def recording(name):
    def call(st, *args, **kw):
      if name not in seen and not any(isinstance(a, jax.core.Tracer) for a in args):
        seen[name] = (st, args, kw)
      return kernels[name](st, *args, **kw)
    return call

  for name in passes:  # gpu.py calls them by these module-level names
    setattr(gpu, name, recording(name))
  jax.block_until_ready(jax.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, i, f, do))  # eager
  times = {name: device_ms(jax.jit(functools.partial(kernels[name], st, **kw)), *args)
           for name, (st, args, kw) in seen.items()}
  print("  ".join(f"{name} {ms:.3f} ms" for name, ms in times.items()), flush=True)
