"""Training throughput of whole models: tokens/s, MFU and peak memory of the real train step.

    python benchmarks/train_step.py                                  # the H200 anchor comparison
    python benchmarks/train_step.py --presets gated_deltanet_340m_fla --batch 8 --seq 4096
    python benchmarks/train_step.py --run_torch                      # + fla and HF Llama, same call
    python benchmarks/train_step.py --run_torch --long               # B=1, T=32,768
    python benchmarks/train_step.py --torch DIR/torch_train_step.json    # torch figures run before
    python benchmarks/train_step.py --long --presets gated_deltanet_340m_fla,gated_deltanet_340m_fla@auto
                                            # the linear ops whole, then on segments of T

--run_torch runs benchmarks/torch_train_step.py (HF's LlamaForCausalLM, then fla's
GatedDeltaNetForCausalLM, at the same batch and length) in a subprocess before JAX touches the GPU,
so the two frameworks never hold device memory at once, and prints its rows beside ours with our
tokens/s as ratios of theirs. fla autotunes its Triton kernels on a fresh machine (more than ten
minutes for this model): the subprocess starts from Triton's autotune results in
benchmarks/fla_autotune_h200.tgz (H200, Triton 3.6, fla 0.6.0; unpacked into TRITON_CACHE_DIR, a
fresh folder when unset) and writes what it holds afterwards to fla_autotune.tgz beside --json:
copy that over the shipped archive to keep what a call tuned. --torch_timeout bounds the
subprocess (a stopped fla keeps Llama's row).

Runs lineax_lm.train.trainer.Trainer's jitted step (AdamW, clipping, bf16 activations with float32
master weights) on random tokens, to set beside fla's GatedDeltaNetForCausalLM timed the same way
with torch (B=8, T=4096, vocab 32,000: 88.8k tokens/s, 54.8 GiB on the H200; benchmarks/RESULTS.md).
MFU uses 6 N FLOPs per token with N all parameters (the anchor's convention) over the device's dense
bf16 peak. Defaults: the fla-matched 340M Gated DeltaNet and the same model with attention at every
4th layer (3:1). Several presets run one process each (the script calls itself with one preset), so
that each row's peak memory is its own.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import functools
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import nullcontext

import jax
import numpy as np

from lineax_lm import sharding
from pallas_kernels.common import segments
from lineax_lm.models.presets import get_preset
from lineax_lm.train import metrics
from lineax_lm.train.config import base_config
from lineax_lm.train.trainer import Trainer, validate_config


def build(preset: str, batch: int, seq: int, overrides: dict, loss_chunk: int):
  model = dataclasses.asdict(get_preset(preset, **overrides))
  model["mixer_cfg"] = dict(model["mixer_cfg"])
  config = base_config()
  config.model = model
  config.data.update(dict(seq_len=seq, global_batch_size=batch))
  config.data.mqar.vocab_size = min(config.data.mqar.vocab_size, model["vocab_size"])
  config.train.update(dict(steps=1000, warmup_steps=10, loss_chunk=loss_chunk))
  mesh = sharding.make_mesh(config.mesh)
  return Trainer(config, validate_config(config, mesh), mesh)


def run(preset, batch, seq, steps, overrides, loss_chunk, profile=0, hlo=None):
  """One preset's row. The first step is split into init (random parameters and optimizer state),
  trace + lower and XLA compile of the train step, and its first run. `profile` > 0: a
  jax.profiler trace of that many further steps, summarised per device op (profile_table);
  `hlo`: a path to write the optimised HLO to (the fusions the profile names)."""
  t0 = time.perf_counter()
  trainer = build(preset, batch, seq, overrides, loss_chunk)
  vocab = trainer.model_cfg.vocab_size
  rng = np.random.default_rng(0)
  batches = [trainer.put_batch({"inputs": rng.integers(0, vocab, (batch, seq), dtype=np.int32),
                                "targets": rng.integers(0, vocab, (batch, seq), dtype=np.int32),
                                "loss_mask": np.ones((batch, seq), np.int32)}) for _ in range(2)]
  split = {}
  with jax.set_mesh(trainer.mesh):
    t = time.perf_counter()
    state = trainer.init()
    jax.block_until_ready(state)
    split["init_s"] = time.perf_counter() - t
    t = time.perf_counter()
    lowered = trainer.train_step.func.lower(state, batches[0], **trainer.train_step.keywords)
    split["lower_s"] = time.perf_counter() - t
    t = time.perf_counter()
    compiled = lowered.compile()
    split["xla_compile_s"] = time.perf_counter() - t
    if hlo:
      with open(hlo, "w") as f:
        f.write(compiled.as_text())
    step = functools.partial(compiled, **trainer.train_step.keywords)
    t = time.perf_counter()
    state, m = step(state, batches[0])
    jax.block_until_ready(m)
    split["first_run_s"] = time.perf_counter() - t
    compile_s = time.perf_counter() - t0
    for i in range(2):
      state, m = step(state, batches[i % 2])
    jax.block_until_ready(m)
    t = time.perf_counter()
    for i in range(steps):
      state, m = step(state, batches[i % 2])
    jax.block_until_ready(m)
    step_s = (time.perf_counter() - t) / steps
    table = None
    if profile:
      trace = tempfile.mkdtemp(prefix="train_step_trace_")
      jax.profiler.start_trace(trace)
      for i in range(profile):
        state, m = step(state, batches[i % 2])
      jax.block_until_ready(m)
      jax.profiler.stop_trace()
      table = profile_table(trace, profile)
  tok_s = batch * seq / step_s
  peak = metrics.peak_flops_per_device()
  row = dict(preset=preset, params_M=trainer.num_params / 1e6, attention_layers=len(trainer.model_cfg.attention_indices),
             step_s=step_s, tokens_per_s=tok_s, mfu_6N=(6 * trainer.num_params * tok_s / (peak * jax.device_count())
                                                         if peak else None),
             peak_GiB=metrics.device_memory_gib(), compile_s=compile_s, loss=float(m["loss"]),
             **split)
  print(json.dumps(row), flush=True)
  return row, table


def profile_table(trace_dir: str, steps: int, top: int = 60) -> str:
  """metrics.profile_summary's per-op table with each op's HLO / JAX names (where the profiler
  records them), so that fusion.N can be read against the optimised HLO."""
  found = metrics.profile_ops(trace_dir)
  if found[0] is None:
    return found[1]
  ops, busy_ns, _ = found
  rows = [metrics.profile_summary(trace_dir, steps, top), "", "| op | ms / step | names |", "|---|---|---|"]
  for name, (ns, _, stats) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]:
    names = "; ".join(f"{k}={v[:160]}" for k, v in stats.items()).replace("|", "/").replace("\n", " ")
    rows.append(f"| {name[:60]} | {ns / 1e6 / steps:.2f} | {names} |")
  return "\n".join(rows)


def torch_rows(path: str, batch: int, seq: int) -> list:
  """Rows of torch_train_step.json in this script's row format (errors kept as such)."""
  with open(path) as f:
    result = json.load(f)
  shape = "" if (result.get("batch"), result.get("seq")) == (batch, seq) else (
      f", B={result.get('batch')} T={result.get('seq')}")
  rows = []
  for name, r in result.get("models", {}).items():
    rows.append(dict(preset=f"{name} (torch {result.get('torch', '?')}{shape})", mfu_6N=None) | r)
    if "params_M" in r and "tokens_per_s" in r:
      peak = metrics.peak_flops_per_device()
      rows[-1]["mfu_6N"] = 6 * r["params_M"] * 1e6 * r["tokens_per_s"] / peak if peak else None
  return rows


FLA_AUTOTUNE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fla_autotune_h200.tgz")


def run_torch(batch: int, seq: int, steps: int, out: str, timeout: float, profile: int = 0,
              models: str | None = None, remat: bool = False) -> str:
  """benchmarks/torch_train_step.py in a subprocess (at most `timeout` seconds) over Triton's cache
  seeded from FLA_AUTOTUNE; the cache's autotune results afterwards go to out/fla_autotune.tgz."""
  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_train_step.py")
  env = dict(os.environ)
  cache = env.get("TRITON_CACHE_DIR") or tempfile.mkdtemp(prefix="triton_cache_")
  env["TRITON_CACHE_DIR"] = cache
  if os.path.exists(FLA_AUTOTUNE):
    with tarfile.open(FLA_AUTOTUNE) as tar:
      tar.extractall(cache, filter="data")
  try:
    subprocess.run([sys.executable, script, "--out", out, "--batch", str(batch), "--seq", str(seq),
                    "--steps", str(steps), "--profile", str(profile)]
                   + (["--models", models] if models else []) + (["--remat"] if remat else []),
                   check=False, env=env, timeout=timeout)
  except subprocess.TimeoutExpired:
    print(f"torch_train_step.py stopped after {timeout:.0f} s (fla still autotuning?)", flush=True)
  tuned = [os.path.join(d, f) for d, _, files in os.walk(cache) for f in files
           if f.endswith(".autotune.json")]
  with tarfile.open(os.path.join(out, "fla_autotune.tgz"), "w:gz") as tar:
    for path in sorted(tuned):
      tar.add(path, arcname=os.path.relpath(path, cache))
  print(f"{len(tuned)} autotune results in {os.path.join(out, 'fla_autotune.tgz')}", flush=True)
  return os.path.join(out, "torch_train_step.json")


def run_each_in_process(a, specs: list[str]) -> list[dict]:
  """Each preset in a process of its own (this script with one preset): its rows."""
  rows = []
  for spec in specs:
    part = os.path.splitext(a.json)[0] + "." + spec.replace(":", "_").replace("@", "_seg") + ".json"
    args = [sys.executable, os.path.abspath(__file__), "--presets", spec, "--json", part]
    for key in ("batch", "seq", "loss_chunk", "steps", "dtype", "remat", "attn_impl", "set",
                "profile"):
      if getattr(a, key) is not None:
        args += [f"--{key}", str(getattr(a, key))]
    args += ["--hlo"] if a.hlo else []
    if subprocess.run(args, check=False).returncode == 0 and os.path.exists(part):
      with open(part) as f:
        rows += json.load(f)
    else:
      rows.append(dict(preset=spec, error="its process failed (its output is above)"))
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--presets", default="gated_deltanet_340m_fla,gated_deltanet_340m_fla:3:1")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=4096)
  p.add_argument("--long", action="store_true", help="the long-context target: B=1, T=32,768")
  p.add_argument("--loss_chunk", type=int, default=base_config().train.loss_chunk,
                 help="tokens per chunk of the fused head + cross-entropy; 0: plain float32 logits")
  p.add_argument("--torch", default=None, help="torch_train_step.json to print beside ours")
  p.add_argument("--run_torch", action="store_true",
                 help="run benchmarks/torch_train_step.py first")
  p.add_argument("--torch_models", default=None,
                 help="torch_train_step.py's --models (default: HF Llama, then fla's GatedDeltaNet)")
  p.add_argument("--torch_timeout", type=float, default=900,
                 help="seconds --run_torch's subprocess may take (fla's autotuning included)")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--remat", default="none")
  p.add_argument("--attn_impl", default="cudnn" if jax.default_backend() == "gpu" else None,
                 help="jax.nn.dot_product_attention implementation of the attention layers")
  p.add_argument("--set", default="", help="ModelConfig overrides of every preset, e.g. "
                 "scan_layers=false,remat=dots (values read as JSON where they parse)")
  p.add_argument("--profile", type=int, default=0,
                 help="trace this many steps after the timed ones; per-op table to <json>.profile.md "
                 "(with --run_torch also fla's and Llama's kernel tables, torch_<model>.kernels.txt)")
  p.add_argument("--hlo", action="store_true", help="write each preset's optimised HLO beside --json")
  p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "train_step.json"))
  a = p.parse_args()
  if a.long:
    a.batch, a.seq = 1, 32768
  if a.run_torch:  # before the first JAX device call: JAX then takes its share of the free memory
    a.torch = run_torch(a.batch, a.seq, a.steps, os.path.dirname(os.path.abspath(a.json)),
                        a.torch_timeout, a.profile, a.torch_models, remat=a.remat != "none")
  specs = a.presets.split(",")
  if len(specs) > 1:
    rows = run_each_in_process(a, specs)
  else:
    print(f"device: {jax.devices()[0].device_kind} x {jax.device_count()}, jax {jax.__version__}")
    rows = [run_one(a, specs[0])]
  if a.torch and os.path.exists(a.torch):
    rows += torch_rows(a.torch, a.batch, a.seq)
  elif a.torch:
    print(f"no torch figures: {a.torch} was not written")
  with open(a.json, "w") as f:
    json.dump(rows, f, indent=1)
  fla = next((r for r in rows if r["preset"].startswith("fla_gated_deltanet")), None)
  llama = next((r for r in rows if r["preset"].startswith("hf_llama")), None)
  print(f"\nB={a.batch} T={a.seq} {a.dtype}, loss_chunk {a.loss_chunk}; tokens/s as ratios of fla's "
        "GatedDeltaNet's and HF Llama's from this call\n"
        "| model | params | tokens/s | vs fla GDN | vs HF Llama | MFU (6N) | peak GiB | step ms | "
        "first step s (init + lower + compile + run) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if "error" in r:
      print(f"| {r['preset']} | error: {r['error'][:200]} |")
      continue
    mfu = f"{r['mfu_6N']:.3f}" if r["mfu_6N"] else "-"
    peak = f"{r['peak_GiB']:.1f}" if r["peak_GiB"] else "-"
    first = r.get("compile_s", r.get("first_step_s"))
    print(f"| {r['preset']} | {r['params_M']:.0f}M | {r['tokens_per_s'] / 1e3:.1f}k | "
          f"{ratio_text(r, fla)} | {ratio_text(r, llama)} | {mfu} | {peak} | "
          f"{r['step_s'] * 1e3:.0f} | {first:.0f}{split_text(r)} |")


def run_one(a, spec: str) -> dict:
  # "name:3:1" = the preset with attn_ratio "3:1"; "name@16" / "name@auto": its linear ops on 16
  # segments of T / on the automatic count (pallas_kernels.common.segments)
  model, _, seg = spec.partition("@")
  preset, _, ratio = model.partition(":")
  overrides = dict(dtype=a.dtype, remat=a.remat, attn_impl=a.attn_impl,
                   **({"attn_ratio": ratio} if ratio else {}), **parse_set(a.set))
  stem = os.path.splitext(a.json)[0] + "." + spec.replace(":", "_").replace("@", "_seg")
  with segments.segment_parallel(seg if seg in ("", "auto") else int(seg)) if seg else nullcontext():
    row, table = run(preset, a.batch, a.seq, a.steps, overrides, a.loss_chunk, a.profile,
                     stem + ".hlo.txt" if a.hlo else None)
  if table:
    with open(stem + ".profile.md", "w") as f:
      f.write(f"# {spec}: B={a.batch} T={a.seq}, {a.profile} steps\n\n{table}\n")
    print(table, flush=True)
  return row | {"preset": spec}


def ratio_text(r: dict, reference: dict | None) -> str:
  if reference is None or "tokens_per_s" not in reference or "tokens_per_s" not in r:
    return "-"
  return f"{r['tokens_per_s'] / reference['tokens_per_s']:.2f}x"


def parse_set(text: str) -> dict:
  out = {}
  for item in filter(None, text.split(",")):
    key, _, value = item.partition("=")
    try:
      out[key] = json.loads(value)
    except ValueError:
      out[key] = value
  return out


def split_text(r: dict) -> str:
  parts = [r.get(k) for k in ("init_s", "lower_s", "xla_compile_s", "first_run_s")]
  return "" if None in parts else " (" + " + ".join(f"{x:.1f}" for x in parts) + ")"


if __name__ == "__main__":
  main()
