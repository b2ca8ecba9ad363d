"""Per-slice cost of context parallelism (`context_axis`) on one device: an op on SLICES slices of T
tokens each, as the devices of a context-parallel group would run it, against the plain op on the
same tokens as a batch of SLICES sequences of T.

    python benchmarks/context_parallel.py [--ops gated_delta_rule] [--backend gpu]
                                          [--lengths 16384,32768,65536,131072] [--slices 2]
                                          [--hkv 16,128,128] [--interpret] [--out DIR]

The slices run under `jax.vmap` with an axis name (so `context_axis` is bound and every slice plays
a device of the group: slice 0 enters with the initial state, the others with a state from before),
which is the per-device program of a context-parallel run without the collectives: those move only
(A, B), O(H x K x (K + V)) floats a slice. Lengths are tried in order and the table stops at the
first that does not fit. Shapes: B = 1, H = 16, K = V = 128, bf16 q, k, v, float32 gates (--hkv).
Times are device medians of back-to-back calls (pallas_kernels.bench.device_ms); fwd+bwd
differentiates sum(o * do) with respect to every input. The ratio cp / plain is the context-parallel
overhead per slice (GDN: one op call at V + K, the transition riding along as K extra value
columns; additive families: a [T, K] x [K, V] product; mLSTM: a re-run).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from pallas_kernels.bench import device_ms, fwd_bwd, make_inputs, op_of  # noqa: E402

AXIS = "context"


def measure(name: str, backend: str, slices: int, T: int, H: int, K: int, V: int,
            interpret: bool = False) -> dict:
  op, names = op_of(name)
  inputs = make_inputs(1, slices * T, H, K, V, jnp.bfloat16)
  static = {"u"}  # inputs without a time axis
  args = tuple(inputs[n] for n in names)
  # The same tokens two ways: [SLICES, 1, T, ...] slices of one sequence, and a batch [SLICES, T, ...].
  sliced = tuple(a if n in static else a.reshape(slices, 1, T, *a.shape[2:])
                 for n, a in zip(names, args))
  batch = tuple(a if n in static else a.reshape(slices, T, *a.shape[2:]) for n, a in zip(names, args))
  axes = tuple(None if n in static else 0 for n in names)
  kw = dict(backend=backend, interpret=True) if interpret else dict(backend=backend)
  cp = jax.vmap(lambda *a: op(*a, context_axis=AXIS, **kw)[0], in_axes=axes, axis_name=AXIS,
                axis_size=slices)
  plain = lambda *a: op(*a, **kw)[0]
  row = dict(op=name, backend=backend, slices=slices, T_slice=T)
  for label, fn, xs in (("plain", plain, batch), ("cp", cp, sliced)):
    fb = fwd_bwd(fn, xs)
    row[f"{label}_fwd_ms"] = device_ms(jax.jit(fn), *xs)
    row[f"{label}_fwdbwd_ms"] = device_ms(fb.step, fb.do, *xs)
    row[f"{label}_peak_GiB"] = fb.peak_GiB
    del fb
  row["fwd_ratio"] = row["cp_fwd_ms"] / row["plain_fwd_ms"]
  row["fwdbwd_ratio"] = row["cp_fwdbwd_ms"] / row["plain_fwdbwd_ms"]
  return row


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ops", default="gated_delta_rule")
  p.add_argument("--backend", default="gpu")
  p.add_argument("--lengths", default="16384,32768,65536,131072")
  p.add_argument("--slices", type=int, default=2)
  p.add_argument("--hkv", default="16,128,128")
  p.add_argument("--interpret", action="store_true", help="Pallas in interpret mode (a CPU smoke test)")
  p.add_argument("--out", default=os.environ.get("OUT", "."))
  a = p.parse_args(argv)
  H, K, V = (int(x) for x in a.hkv.split(","))
  rows = []
  for name in a.ops.split(","):
    for T in (int(x) for x in a.lengths.split(",")):
      try:
        rows.append(measure(name, a.backend, a.slices, T, H, K, V, a.interpret))
      except Exception as e:  # the first length that does not fit ends this op's rows
        print(f"{name} T_slice={T}: stopped ({type(e).__name__}: {str(e)[:200]})", flush=True)
        break
      print(json.dumps(rows[-1]), flush=True)
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, "context_parallel.json"), "w") as f:
    json.dump(rows, f, indent=1)
  print(f"\n| op | T per slice x {a.slices} | plain fwd / fwd+bwd ms | cp fwd / fwd+bwd ms | "
        "cp / plain fwd, fwd+bwd | peak GiB plain / cp |\n|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['op']} | {r['T_slice']} | {r['plain_fwd_ms']:.2f} / {r['plain_fwdbwd_ms']:.2f} | "
          f"{r['cp_fwd_ms']:.2f} / {r['cp_fwdbwd_ms']:.2f} | "
          f"{r['fwd_ratio']:.2f}, {r['fwdbwd_ratio']:.2f} | "
          f"{r['plain_peak_GiB']:.1f} / {r['cp_peak_GiB']:.1f} |")


if __name__ == "__main__":
  main()
