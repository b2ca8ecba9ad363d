"""Training throughput of whole models: tokens/s, MFU and peak memory of the real train step.

    python benchmarks/train_step.py                                  # the H200 anchor comparison
    python benchmarks/train_step.py --presets gated_deltanet_340m_fla --batch 8 --seq 4096
    python benchmarks/train_step.py --run_torch                      # + fla and HF Llama, same call
    python benchmarks/train_step.py --run_torch --long               # B=1, T=32,768
    python benchmarks/train_step.py --torch DIR/torch_train_step.json    # torch figures run before
    python benchmarks/train_step.py --long --presets gated_deltanet_340m_fla,gated_deltanet_340m_fla@auto
                                            # the linear ops whole, then on segments of T
    python benchmarks/train_step.py --long --presets "gated_deltanet_340m_fla,gated_deltanet_340m_fla#keep_states=1"
                                            # the GPU kernels' defaults, then a Config variant
    python benchmarks/train_step.py --config.model.scan_layers=true  # a ModelConfig field of every preset

--run_torch runs benchmarks/torch_train_step.py (HF's LlamaForCausalLM, then fla's
GatedDeltaNetForCausalLM, at the same batch and length) in a subprocess before JAX touches the GPU,
so the two frameworks never hold device memory at once, and prints its rows beside ours with our
tokens/s as ratios of theirs. fla autotunes its Triton kernels on a fresh machine (more than ten
minutes for this model): the subprocess starts from Triton's autotune results in
benchmarks/fla_autotune.tgz (tuned on the H200 and the H100, Triton 3.6, fla 0.6.0; unpacked into
TRITON_CACHE_DIR, a fresh folder when unset) and writes what it holds afterwards to
fla_autotune.tgz beside --json: copy that over the shipped archive to keep what a call tuned.
--torch_timeout bounds the subprocess (a stopped fla keeps Llama's row).

Runs lineax_lm.train.trainer.Trainer's jitted step (AdamW, clipping, bf16 activations with float32
master weights) on random tokens, to set beside fla's GatedDeltaNetForCausalLM timed the same way
with torch (B=8, T=4096, vocab 32,000: 88.8k tokens/s, 54.8 GiB on the H200; benchmarks/RESULTS.md).
MFU uses 6 N FLOPs per token with N all parameters (the anchor's convention) over the device's dense
bf16 peak. Defaults: the fla-matched 340M Gated DeltaNet and the same model with attention at every
4th layer (3:1). Several presets run one process each (the script calls itself with one preset and
the same flags), so that each row's peak memory is its own. `--config.model.<field>=value` overrides
a ModelConfig field of every preset (ml_collections' syntax, as lineax_lm's commands take it);
--batch, --seq, --loss_chunk, --dtype, --remat and --attn_impl set their config fields.
"""
from __future__ import annotations

import dataclasses
import json
import os
import functools
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import types
import typing
from contextlib import nullcontext

import jax
import ml_collections
import numpy as np
from ml_collections import config_dict

from lineax_lm import sharding
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.presets import PRESETS, model_config
from lineax_lm.train import metrics
from lineax_lm.train.config import base_config
from lineax_lm.train.trainer import Trainer, validate_config
from pallas_kernels import bench
from pallas_kernels.common import segments

# This script's flags and the config field each sets: `--config.<field>` is refused for these.
FLAG_FIELDS = {"batch": "data.global_batch_size", "seq": "data.seq_len",
               "loss_chunk": "train.loss_chunk", "dtype": "model.dtype", "remat": "model.remat",
               "attn_impl": "model.attn_impl", "presets": "model.preset"}


def benchmark_config() -> ml_collections.ConfigDict:
  """base_config() with a 1,000-step schedule and a model section of a preset (each row's) and
  every ModelConfig field but mixer_cfg as a typed placeholder: None keeps the preset's value,
  `--config.model.<field>=value` overrides it in every row (presets.model_config)."""
  c = base_config()
  c.train.update(dict(steps=1000, warmup_steps=10))
  hints = typing.get_type_hints(ModelConfig)
  fields = {}
  for field in dataclasses.fields(ModelConfig):
    if field.name != "mixer_cfg":
      kinds = [t for t in typing.get_args(hints[field.name]) if t is not type(None)]
      kind = kinds[0] if kinds else hints[field.name]
      fields[field.name] = config_dict.placeholder(typing.get_origin(kind) or kind)
  c.model = ml_collections.ConfigDict(dict(preset="", **fields))
  return c


def build(config):
  """The Trainer of a benchmark config whose model section names its preset."""
  config = config.copy_and_resolve_references()
  # the fields left None are the preset's (model_config); the config's checks read the rest
  config.model = ml_collections.ConfigDict({k: v for k, v in config.model.items() if v is not None})
  config.data.mqar.vocab_size = min(config.data.mqar.vocab_size, model_config(config.model).vocab_size)
  mesh = sharding.make_mesh(config.mesh)
  return Trainer(config, validate_config(config, mesh), mesh)


def run(config, steps, profile=0, hlo=None):
  """One row: the train step of `config` (a `benchmark_config` naming its preset). The first step
  is split into init (random parameters and optimizer state), trace + lower and XLA compile of the
  train step, and its first run. `profile` > 0: a jax.profiler trace of that many further steps,
  summarised per device op (profile_table); `hlo`: a path to write the optimised HLO to (the
  fusions the profile names)."""
  t0 = time.perf_counter()
  trainer = build(config)
  batch, seq = config.data.global_batch_size, config.data.seq_len
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
  row = dict(preset=config.model.preset, params_M=trainer.num_params / 1e6, attention_layers=len(trainer.model_cfg.attention_indices),
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


FLA_AUTOTUNE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fla_autotune.tgz")


def run_torch(batch: int, seq: int, steps: int, out: str, timeout: float, profile: int = 0,
              models: str | None = None, remat: bool = False) -> str:
  """benchmarks/torch_train_step.py through run_torch_script: the path of its JSON."""
  run_torch_script([sys.executable, "torch_train_step.py", "--out", out, "--batch", str(batch),
                    "--seq", str(seq), "--steps", str(steps), "--profile", str(profile)]
                   + (["--models", models] if models else []) + (["--remat"] if remat else []),
                   out, timeout)
  return os.path.join(out, "torch_train_step.json")


def run_torch_script(command: list[str], out: str, timeout: float) -> None:
  """command = [python, a torch script beside this file, its arguments...] in a subprocess (at
  most `timeout` seconds) over Triton's cache seeded from FLA_AUTOTUNE; the cache's autotune
  results afterwards go to out/fla_autotune.tgz."""
  python, script, *args = command
  env = dict(os.environ)
  cache = env.get("TRITON_CACHE_DIR") or tempfile.mkdtemp(prefix="triton_cache_")
  env["TRITON_CACHE_DIR"] = cache
  if os.path.exists(FLA_AUTOTUNE):
    with tarfile.open(FLA_AUTOTUNE) as tar:
      tar.extractall(cache, filter="data")
  try:
    subprocess.run([python, os.path.join(os.path.dirname(FLA_AUTOTUNE), script), *args],
                   check=False, env=env, timeout=timeout)
  except subprocess.TimeoutExpired:
    print(f"{script} stopped after {timeout:.0f} s (fla still autotuning?)", flush=True)
  tuned = [os.path.join(d, f) for d, _, files in os.walk(cache) for f in files
           if f.endswith(".autotune.json")]
  with tarfile.open(os.path.join(out, "fla_autotune.tgz"), "w:gz") as tar:
    for path in sorted(tuned):
      tar.add(path, arcname=os.path.relpath(path, cache))
  print(f"{len(tuned)} autotune results in {os.path.join(out, 'fla_autotune.tgz')}", flush=True)


def run_each_in_process(a, specs: list[str]) -> list[dict]:
  """Each preset in a process of its own (this script with one preset and the same flags and
  `--config.*` overrides): its rows."""
  rows = []
  for spec in specs:
    part = os.path.splitext(a.json)[0] + "." + spec_file_name(spec) + ".json"
    args = [sys.executable, os.path.abspath(__file__), "--presets", spec, "--json", part]
    for key in ("batch", "seq", "loss_chunk", "steps", "dtype", "remat", "attn_impl", "profile"):
      if getattr(a, key) is not None:
        args.append(f"--{key}={getattr(a, key)}")
    args += ["--hlo"] if a.hlo else []
    args += [f"--config.{field}={value}" for field, value in a.overrides.items()]
    returncode, why = _run_echoing_stderr(args)
    if returncode == 0 and os.path.exists(part):
      with open(part) as f:
        rows += json.load(f)
    else:
      rows.append(dict(preset=spec, error=f"its process failed: {why or f'exit code {returncode}'}"))
  return rows


def _run_echoing_stderr(args: list[str]) -> tuple[int, str]:
  """Runs `args`, its stderr passed on line by line as it comes (a run killed from outside keeps
  what it printed); returns (exit code, its last error line: e.g. XLA's out-of-memory line)."""
  child = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, errors="replace")
  why = ""
  for line in child.stderr:
    sys.stderr.write(line)
    sys.stderr.flush()
    if "Error" in line.split(":", 1)[0] or "RESOURCE_EXHAUSTED" in line:
      why = line.strip()[:300]
  return child.wait(), why


def define_flags(fv, argv: list[str]) -> None:
  from absl import flags
  from ml_collections import config_flags
  flags.DEFINE_list("presets", ["gated_deltanet_340m_fla", "gated_deltanet_340m_fla:3:1"],
                    "presets to time, each a process of its own; name:3:1 with attn_ratio 3:1, "
                    "name@16 / name@auto with its linear ops on segments of T", flag_values=fv)
  flags.DEFINE_integer("batch", 8, "rows a step", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("seq", 4096, "tokens a row", lower_bound=1, flag_values=fv)
  flags.DEFINE_bool("long", False, "the long-context target: B=1, T=32,768", flag_values=fv)
  flags.DEFINE_integer("loss_chunk", None, "tokens per chunk of the fused head + cross-entropy; "
                       f"0: plain float32 logits (default: {base_config().train.loss_chunk})",
                       lower_bound=0, flag_values=fv)
  define_torch_flags(fv, "torch_train_step", "HF Llama, then fla's GatedDeltaNet", 900)
  flags.DEFINE_integer("steps", 10, "steps timed", lower_bound=1, flag_values=fv)
  flags.DEFINE_string("dtype", "bfloat16", "activations", flag_values=fv)
  flags.DEFINE_string("remat", "none", "remat policy (lineax_lm.models.config.REMAT_POLICIES)",
                      flag_values=fv)
  flags.DEFINE_string("attn_impl", None, "jax.nn.dot_product_attention implementation of the "
                      "attention layers (default: cudnn on a GPU, else jax's choice)", flag_values=fv)
  flags.DEFINE_integer("profile", 0, "trace this many steps after the timed ones; per-op table to "
                       "<json>.profile.md (with --run_torch also fla's and Llama's kernel tables, "
                       "torch_<model>.kernels.txt)", lower_bound=0, flag_values=fv)
  flags.DEFINE_bool("hlo", False, "write each preset's optimised HLO beside --json", flag_values=fv)
  flags.DEFINE_string("json", os.path.join(os.environ.get("OUT", "."), "train_step.json"),
                      "the rows' file", flag_values=fv)
  config_flags.DEFINE_config_dict(
      "config", benchmark_config(), "the training config of every row (lineax_lm.train.config."
      "base_config): --config.model.<field>=value overrides a ModelConfig field of every preset, "
      "e.g. --config.model.scan_layers=true; --config.mesh.*, --config.train.* as in training",
      flag_values=fv, sys_argv=argv)


def define_torch_flags(fv, script: str, models: str, timeout: float) -> None:
  """--torch, --run_torch, --torch_models and --torch_timeout of a benchmark whose torch side is
  benchmarks/<script>.py (its --models default: `models`)."""
  from absl import flags
  flags.DEFINE_string("torch", None, f"{script}.json to print beside ours", flag_values=fv)
  flags.DEFINE_bool("run_torch", False, f"run benchmarks/{script}.py first", flag_values=fv)
  flags.DEFINE_string("torch_models", None, f"{script}.py's --models (default: {models})",
                      flag_values=fv)
  flags.DEFINE_float("torch_timeout", timeout, "seconds --run_torch's subprocess may take (fla's "
                     "compilation and autotuning included)", lower_bound=0, flag_values=fv)


def parse_args(argv=None) -> types.SimpleNamespace:
  """The flags, with `config` the training config they give (each row sets its preset) and
  `overrides` its --config.<field> overrides; a bad flag exits with one line naming it."""
  from ml_collections import config_flags
  from lineax_lm import cli
  fv = cli.parse(define_flags, argv, "python benchmarks/train_step.py", __doc__)
  overrides = config_flags.get_override_values(fv["config"])
  for flag, field in FLAG_FIELDS.items():
    if field in overrides:
      cli.fail(f"--config.{field}: set it with --{flag}")
  specs = [parse_spec(s) for s in fv.presets]
  unknown = [s for s, spec in zip(fv.presets, specs) if spec.preset not in PRESETS]
  if unknown:
    cli.fail(f"--presets: unknown preset(s) {unknown}; choose from {sorted(PRESETS)}")
  for spec in specs:
    try:
      bench.variants(spec.variant) if spec.variant else None
    except ValueError as e:
      cli.fail(f"--presets: {e}")
  a = types.SimpleNamespace(**fv.flag_values_dict(), overrides=overrides)
  if a.long:
    a.batch, a.seq = 1, 32768
  if a.attn_impl is None and jax.default_backend() == "gpu":
    a.attn_impl = "cudnn"
  a.config.data.update(dict(seq_len=a.seq, global_batch_size=a.batch))
  if a.loss_chunk is not None:
    a.config.train.loss_chunk = a.loss_chunk
  a.config.model.update(dict(dtype=a.dtype, remat=a.remat, attn_impl=a.attn_impl))
  return a


def main(argv=None):
  a = parse_args(argv)
  if a.run_torch:  # before the first JAX device call: JAX then takes its share of the free memory
    a.torch = run_torch(a.batch, a.seq, a.steps, os.path.dirname(os.path.abspath(a.json)),
                        a.torch_timeout, a.profile, a.torch_models, remat=a.remat != "none")
  if len(a.presets) > 1:
    rows = run_each_in_process(a, a.presets)
  else:
    print(f"device: {jax.devices()[0].device_kind} x {jax.device_count()}, jax {jax.__version__}")
    rows = [run_one(a, a.presets[0])]
  if a.torch and os.path.exists(a.torch):
    rows += torch_rows(a.torch, a.batch, a.seq)
  elif a.torch:
    print(f"no torch figures: {a.torch} was not written")
  with open(a.json, "w") as f:
    json.dump(rows, f, indent=1)
  fla = next((r for r in rows if r["preset"].startswith("fla_gated_deltanet")), None)
  llama = next((r for r in rows if r["preset"].startswith("hf_llama")), None)
  print(f"\nB={a.batch} T={a.seq} {a.dtype}, loss_chunk {a.config.train.loss_chunk}; tokens/s as "
        "ratios of fla's GatedDeltaNet's and HF Llama's from this call\n"
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


def spec_file_name(spec: str) -> str:
  """A preset spec as a file name's part: letters, digits, '.', '_' and '-' (what a device call
  brings back)."""
  return re.sub(r"[^A-Za-z0-9._-]", "_", spec)


class Spec(typing.NamedTuple):
  """A --presets entry "name[:ratio][@segments][#variant]": "name:3:1" the preset with attn_ratio
  "3:1"; "name@16" / "name@auto" its linear ops on 16 segments of T / on the automatic count
  (pallas_kernels.common.segments); "name#V" its GPU kernels on the Config variant V
  (pallas_kernels.bench's VARIANTS syntax, e.g. "#keep_states=1" for the gated delta rule's)."""
  preset: str
  ratio: str
  segments: str
  variant: str


def parse_spec(spec: str) -> Spec:
  model, _, variant = spec.partition("#")
  model, _, seg = model.partition("@")
  preset, _, ratio = model.partition(":")
  return Spec(preset, ratio, seg, variant)


def run_one(a, spec: str) -> dict:
  preset, ratio, seg, variant = parse_spec(spec)
  config = a.config.copy_and_resolve_references()
  config.model.preset = preset
  if ratio:
    config.model.attn_ratio = ratio
  stem = os.path.splitext(a.json)[0] + "." + spec_file_name(spec)
  with (segments.segment_parallel(seg if seg in ("", "auto") else int(seg)) if seg else nullcontext(),
        bench.gpu_defaults(variant)):
    row, table = run(config, a.steps, a.profile, stem + ".hlo.txt" if a.hlo else None)
  if table:
    with open(stem + ".profile.md", "w") as f:
      f.write(f"# {spec}: B={a.batch} T={a.seq}, {a.profile} steps\n\n{table}\n")
    print(table, flush=True)
  return row | {"preset": spec}


def ratio_text(r: dict, reference: dict | None) -> str:
  if reference is None or "tokens_per_s" not in reference or "tokens_per_s" not in r:
    return "-"
  return f"{r['tokens_per_s'] / reference['tokens_per_s']:.2f}x"


def split_text(r: dict) -> str:
  parts = [r.get(k) for k in ("init_s", "lower_s", "xla_compile_s", "first_run_s")]
  return "" if None in parts else " (" + " + ".join(f"{x:.1f}" for x in parts) + ")"


if __name__ == "__main__":
  main()
