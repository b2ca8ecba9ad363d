"""GPU benchmark of the chunked ops: xla vs Pallas (gpu), forward and forward+backward, peak memory of
forward+backward, a stage profile and tile variants of the gated delta rule kernels, and fla/ours
ratios when fla's figures from the same run are given.

    python benchmarks/ops.py [--ops gated_delta_rule,delta_rule,simple_gla] [--fla DIR] [--out DIR]
                             [--profile] [--variants] [--scaling]

--fla DIR reads anchor_torch.json (../shared/bench/fla_ops_h200.py, RESULTS_DIR=DIR) and
fla_memory.json (benchmarks/fla_memory.py) from DIR. Shapes: B=4, T=4096, H=16, K=V=128, bf16 inputs,
float32 gates (the anchor of ../shared/anchors/H200.md); --scaling adds T in {2048, 8192, 32768} at
65,536 tokens per step. Times are device medians: each repetition enqueues `--calls` back-to-back
calls and divides, so host dispatch hides behind device work. fwd+bwd differentiates sum(o * do)
with respect to every input. Peak memory is XLA's allocation for the compiled fwd+bwd (arguments +
outputs + temporaries).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels.bench import make_inputs  # noqa: E402

INTERPRET = False  # --interpret: run the Pallas paths interpreted (a CPU smoke test of this script)
def _variants():
  """Configs to time: env VARIANTS="bv_state=16,warps_dqkw=8+bk_dqkw=128" (',' between variants,
  '+' between the fields of one)."""
  from pallas_kernels.common.gpu.config import Config
  spec = os.environ.get("VARIANTS", "warps_wy=1,warps_wy_bwd=4")
  return tuple(Config(**{k: int(x) for k, x in (kv.split("=") for kv in v.split("+"))})
               for v in spec.split(","))


FLA_NAMES = {"gated_delta_rule": "gated_delta_rule", "delta_rule": "delta_rule",
             "simple_gla": "simple_gla(mamba2-like)"}


def device_ms(fn, *args, calls=10, reps=7):
  """Median over `reps` of (time of `calls` back-to-back calls) / calls, after a warm-up."""
  jax.block_until_ready(fn(*args))
  jax.block_until_ready(fn(*args))
  out = []
  for _ in range(reps):
    t0 = time.perf_counter()
    r = [fn(*args) for _ in range(calls)]
    jax.block_until_ready(r)
    out.append((time.perf_counter() - t0) / calls)
    del r
  return float(np.median(out) * 1e3)


def peak_bytes(fn, *args):
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def op_fn(name, backend, config=None):
  """(function of the op's inputs -> o, argument names) for `backend`."""
  kw = dict(interpret=True) if INTERPRET and backend == "gpu" else {}
  kw.update({} if config is None else dict(config=config))
  if name == "gated_delta_rule":
    if config is not None:  # tile variants call the kernel module directly
      from pallas_kernels.gated_delta_rule import gpu
      return (lambda q, k, v, g, b: gpu.chunk_gated_delta_rule(q, k, v, g, b, scale=q.shape[-1] ** -0.5,
                                                               **kw)[0]), ("q", "kn", "v", "gs", "beta")
    from pallas_kernels.gated_delta_rule import chunk_gated_delta_rule as f
    return (lambda q, k, v, g, b: f(q, k, v, g, b, backend=backend, **kw)[0]), ("q", "kn", "v", "gs", "beta")
  if name == "delta_rule":
    try:
      f = importlib.import_module("pallas_kernels.delta_rule").chunk_delta_rule
      return (lambda q, k, v, b: f(q, k, v, b, backend=backend, **kw)[0]), ("q", "kn", "v", "beta")
    except (ModuleNotFoundError, AttributeError):  # the family folder is not there yet: g = None
      mod = importlib.import_module(f"pallas_kernels.gated_delta_rule.{backend}")
      return (lambda q, k, v, b: mod.chunk_gated_delta_rule(q, k, v, None, b, scale=q.shape[-1] ** -0.5, **kw)[0]
              ), ("q", "kn", "v", "beta")
  if name == "simple_gla":
    f = importlib.import_module("pallas_kernels.simple_gla").chunk_simple_gla
    return (lambda q, k, v, g: f(q, k, v, g=g, backend=backend, **kw)[0]), ("q", "k", "v", "gs")
  if name == "hgrn":  # x, g [B, T, H * K]
    f = importlib.import_module("pallas_kernels.hgrn").chunk_hgrn
    return (lambda x, g: f(x, g, backend=backend, **kw)[0]), ("x", "gx")
  raise ValueError(f"unknown op {name!r}")


def time_op(name, backend, inputs, config=None, memory=True):
  fn, names = op_fn(name, backend, config)
  args = tuple(inputs[n] for n in names)
  fwd = jax.jit(fn)
  o = fwd(*args)
  do = jnp.asarray(np.random.default_rng(1).standard_normal(o.shape, dtype=np.float32), o.dtype)
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * do)
  grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
  row = dict(fwd_ms=device_ms(fwd, *args), fwdbwd_ms=device_ms(grad, *args))
  if memory:
    try:
      row["peak_GiB"] = peak_bytes(jax.grad(loss, argnums=tuple(range(len(args)))), *args) / 2**30
    except Exception as e:  # memory_analysis is not available on every backend
      row["peak_GiB"], row["peak_error"] = float("nan"), repr(e)[:100]
  return row


def stage_profile(inputs, config=None):
  """Times each GDN kernel alone at the inputs' shape (the forward's and the backward's stages): its
  WY kernels (gated_delta_rule/gpu.py) and the common stages (pallas_kernels/common/gpu/)."""
  from pallas_kernels.common.gpu import chunk_dh, chunk_dqk, chunk_state
  from pallas_kernels.common.gpu.config import CHUNK, DEFAULT, Static
  from pallas_kernels.common.gpu.layout import chunk_cumsum, head_major
  from pallas_kernels.gated_delta_rule import gpu
  cfg = config or DEFAULT
  q, k, v, g, beta = (inputs[n] for n in ("q", "kn", "v", "gs", "beta"))
  B, T, H, K = q.shape
  V = v.shape[-1]
  st = Static(K ** -0.5, False, INTERPRET, cfg)
  G, b = chunk_cumsum(head_major(g), CHUNK), head_major(beta)
  h0 = jnp.zeros((B, H, K, V), jnp.float32)
  z = jnp.zeros((1,), jnp.int32)
  w, u, Tinv = jax.jit(lambda k, v, G, b: gpu._wy_fwd(k, v, G, b, st))(k, v, G, b)
  do = jnp.asarray(np.random.default_rng(1).standard_normal(v.shape, dtype=np.float32), v.dtype)
  stages = {
      "fwd.wy": (lambda k, v, G, b: gpu._wy_fwd(k, v, G, b, st), (k, v, G, b)),
      "fwd.state+o": (lambda q, k, w, u, G: chunk_state.state_pass(q, k, w, u, G, h0, z, z, st, True),
                      (q, k, w, u, G)),
      "bwd.state(h,v')": (lambda k, w, u, G: chunk_state.state_pass(None, k, w, u, G, h0, z, z, st, False),
                          (k, w, u, G)),
      "bwd.dh": (lambda q, k, w, do, G: chunk_dh.dh_pass(q, k, w, do, G, h0, z, z, st), (q, k, w, do, G)),
  }
  h, vn = jax.jit(stages["bwd.state(h,v')"][0])(k, w, u, G)
  dh, dvn, _ = jax.jit(stages["bwd.dh"][0])(q, k, w, do, G)
  stages["bwd.dqkw"] = (lambda q, k, G, h, dh, do, vn, dvn: chunk_dqk.dqk_pass(q, k, G, h, dh, do, vn, dvn, st,
                                                                              want_dw=True),
                        (q, k, G, h, dh, do, vn, dvn))
  dq, dk1, dG1, dw = jax.jit(stages["bwd.dqkw"][0])(*stages["bwd.dqkw"][1])
  stages["bwd.wy"] = (lambda k, v, G, b, Ti, dw, dvn, dk1, dG1: gpu._bwd_wy(k, v, G, b, Ti, dw, dvn, dk1, dG1, st),
                      (k, v, G, b, Tinv, dw, dvn, dk1, dG1))
  return {name: device_ms(jax.jit(f), *a) for name, (f, a) in stages.items()}


def load_fla(d):
  fla = {}
  if d and os.path.exists(os.path.join(d, "anchor_torch.json")):
    fla = json.load(open(os.path.join(d, "anchor_torch.json")))
  mem = {}
  if d and os.path.exists(os.path.join(d, "fla_memory.json")):
    mem = json.load(open(os.path.join(d, "fla_memory.json")))
  return fla, mem


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ops", default="gated_delta_rule,delta_rule,simple_gla")
  p.add_argument("--backends", default="xla,gpu")
  p.add_argument("--fla", default=None)
  p.add_argument("--out", default=os.environ.get("OUT", "."))
  p.add_argument("--profile", action="store_true")
  p.add_argument("--variants", action="store_true")
  p.add_argument("--scaling", action="store_true")
  p.add_argument("--lengths", default="2048,8192,32768", help="T values of --scaling (65,536 tokens a step)")
  p.add_argument("--interpret", action="store_true")
  p.add_argument("--report", action="store_true", help="only print the tables of OUT/ops.json with --fla")
  p.add_argument("--shape", default="4,4096,16,128,128", help="B,T,H,K,V")
  a = p.parse_args(argv)
  B, T, H, K, V = map(int, a.shape.split(","))
  global INTERPRET
  INTERPRET = a.interpret
  print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}; B={B} T={T} H={H} K={K} V={V} bf16",
        flush=True)
  fla, fla_mem = load_fla(a.fla)
  if a.report:
    return print_tables(json.load(open(os.path.join(a.out, "ops.json"))), fla, fla_mem)
  inputs = make_inputs(B, T, H, K, V, jnp.bfloat16)
  res = dict(rows=[], profile={}, variants=[], scaling=[])
  os.makedirs(a.out, exist_ok=True)

  def save():  # after every figure: what was measured survives a timeout of the device call
    json.dump(res, open(os.path.join(a.out, "ops.json"), "w"), indent=1)

  def run(label, f, *args, **kw):
    try:
      r = f(*args, **kw)
      print(label, r, flush=True)
      return r
    except Exception as e:  # keep going: one failing variant must not cost the whole device call
      traceback.print_exc()
      print(label, "ERROR", repr(e)[:300], flush=True)
      return dict(error=repr(e)[:300])

  for name in filter(None, a.ops.split(",")):  # --ops "": only what the other flags ask for
    for backend in a.backends.split(","):
      r = run(f"{name}/{backend}", time_op, name, backend, inputs)
      res["rows"].append(dict(op=name, backend=backend, **r))
      save()
  if a.profile:
    res["profile"] = run("profile", stage_profile, inputs) or {}
    save()
  if a.variants:
    VARIANTS = _variants()
    for cfg in VARIANTS:
      r = run(f"variant {cfg}", time_op, "gated_delta_rule", "gpu", inputs, config=cfg, memory=False)
      res["variants"].append(dict(config=cfg._asdict(), **r))
      save()
  if a.scaling:
    del inputs
    for Tl in map(int, a.lengths.split(",")):
      inp = make_inputs(65536 // Tl, Tl, H, K, V, jnp.bfloat16)
      for backend in sorted(a.backends.split(","), key=lambda b: b == "xla"):  # xla last: the slowest
        r = run(f"scaling T={Tl} {backend}", time_op, "gated_delta_rule", backend, inp)
        res["scaling"].append(dict(T=Tl, backend=backend, **r))
        save()
      del inp
  print_tables(res, fla, fla_mem)


def print_tables(res, fla, fla_mem):
  ops = fla.get("ops", {})
  print("\n| op | backend | fwd ms | fwd+bwd ms | peak GiB | fla fwd/ours | fla fwd+bwd/ours | fla peak GiB |")
  print("|---|---|---|---|---|---|---|---|")
  for r in res["rows"]:
    if "error" in r:
      print(f"| {r['op']} | {r['backend']} | error: {r['error'][:60]} |")
      continue
    f = ops.get(FLA_NAMES.get(r["op"], ""), {})
    m = fla_mem.get(r["op"], {}).get("4096", {})
    ratio = lambda key: f"{f[key] / r[key]:.2f}" if key in f else "-"
    print(f"| {r['op']} | {r['backend']} | {r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | {r['peak_GiB']:.2f} | "
          f"{ratio('fwd_ms')} | {ratio('fwdbwd_ms')} | {m.get('peak_GiB', '-')} |")
  if res["profile"]:
    print("\nGDN stages (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in res["profile"].items()
                                           if isinstance(v, float)))
  for r in res["variants"]:
    print("variant", {k: v for k, v in r["config"].items() if v != getattr(_default(), k)},
          {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "config"})
  for r in res["scaling"]:
    m = fla_mem.get("gated_delta_rule", {}).get(str(r["T"]), {})
    print("scaling", r, "fla peak GiB", m.get("peak_GiB", "-"), "fla fwd+bwd ms", m.get("fwdbwd_ms", "-"))


def _default():
  from pallas_kernels.common.gpu.config import DEFAULT
  return DEFAULT


if __name__ == "__main__":
  main()
