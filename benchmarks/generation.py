"""Generation speed of whole models: prefill, decode tokens/s, time to first token, compile time and
peak memory of lineax_lm's `generate`, beside fla's and HF Llama's `generate` from the same call.

On the H200, one device call with carry [".whl"] (fla 0.6.0 and einops wheels in .whl/, as
benchmarks/make_fla_fixtures.py says, with the wheels launch/h200_env.sh installs):

    bash benchmarks/generation.sh     # python3 benchmarks/generation.py --run_torch --out $OUT/gen

    python benchmarks/generation.py --presets gated_deltanet_340m_fla --batches 1 --new_tokens 64
    python benchmarks/generation.py --torch DIR/torch_generation.json   # torch figures run before
    python benchmarks/generation.py --report --out DIR    # the table of a call stopped before it
                                                          # (give it that call's flags)
    python benchmarks/generation.py --prompt 32 --new_tokens 8 --batches 1,2 --run_torch \\
        --torch_python /path/to/torch/python --config.model.num_layers=4 \\
        --config.model.hidden=64 --config.model.vocab_size=512    # end to end on a CPU, tiny

--run_torch runs benchmarks/torch_generation.py (HF's LlamaForCausalLM, fla's
GatedDeltaNetForCausalLM and the same with attention at every 4th layer, HF `generate`, bf16) in a
subprocess before JAX touches the GPU, over the fla autotune archive train_step.py uses
(benchmarks/fla_autotune.tgz; what the call tuned comes back as fla_autotune.tgz in --out),
and prints its rows beside ours. --config.model.num_layers, .hidden and .vocab_size pass on to it
as --layers, --hidden and --vocab.

Ours: each preset (default the fla-matched 475M Gated DeltaNet and the same with attention at every
4th layer, `name:3:1` as in train_step.py) in a process of its own with random weights, weights and
activations in --dtype, through lineax_lm.models.generate.generate on --batches rows of --prompt
random tokens. The measures are torch_generation.py's (its docstring), with these differences:
prefill_s is generate(max_new_tokens=1) (the prefill and the first token's pick: ours runs both in
one program), first_call_s and the new prompt lengths' times include XLA's compilation, given
apart as compile_s (tracing, lowering and XLA compile, from jax.monitoring); the new prompt lengths
are timed last, after every batch, at the smallest batch, where they share the length bucket of
--prompt and so its compiled program (lineax_lm prefills the bucket's whole width with the prompt
length as a traced value): compile_s says whether they compiled anything. Peak is the process's
peak device memory after the batch (its earlier batches included). Each part is bounded in time:
a measure stops repeating after --measure_s, a preset's process after --preset_timeout, the torch
subprocess after --torch_timeout; rows are written as they are measured, so a stopped part keeps
what it measured. --profile N traces N prefills of each preset's largest batch after its measures,
as generate runs them and as the model's prefill step alone with and without the traced prompt
length (`profile_prefill`: each form's time, XLA temporaries and the per-op table of train_step.py's
--profile).

Writes --out/generation.json (every row and the call's device, versions, date and command) and
--out/generation.md (the table), and prints the table last.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import types

import jax
import ml_collections
import numpy as np
from flax import nnx

from lineax_lm.models.generate import generate
from lineax_lm.models.hybrid import HybridLM
from lineax_lm.models.presets import PRESETS, model_config
from lineax_lm.train import metrics
from torch_generation import median_time, new_lengths
from train_step import benchmark_config, define_torch_flags, profile_table, run_torch_script

# jax.monitoring's events of a compilation: their durations summed are the compile time of a call
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
_compile_seconds = [0.0]


def _count_compile(event: str, duration: float, **_):
  if event in COMPILE_EVENTS:
    _compile_seconds[0] += duration


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def timed_with_compile(call) -> tuple[float, float]:
  """(wall seconds, compile seconds) of one call of `call`."""
  compiled, t = _compile_seconds[0], time.perf_counter()
  call()
  return time.perf_counter() - t, _compile_seconds[0] - compiled


def build_model(a, spec: str) -> HybridLM:
  """The random-weight model of preset spec "name" or "name:3:1" (attn_ratio 3:1), with the
  --config.model overrides and weights and activations in --dtype."""
  preset, _, ratio = spec.partition(":")
  section = a.config.model.copy_and_resolve_references()
  section.update(dict(preset=preset, dtype=a.dtype, param_dtype=a.dtype))
  if ratio:
    section.attn_ratio = ratio
  return HybridLM(model_config(section), nnx.Rngs(0))


def measure(model, ids: np.ndarray, a, row: dict, save) -> None:
  """Fills `row` with the figures of generating after `ids` [B, P] (the module docstring's), calling
  save() after each."""
  def call(prompt, new):
    jax.block_until_ready(generate(model, prompt, new))

  batch = ids.shape[0]
  row["first_call_s"], row["compile_s"] = timed_with_compile(lambda: call(ids, a.new_tokens))
  row["generate_s"], row["repeats"] = median_time(lambda: call(ids, a.new_tokens), a.repeats,
                                                  a.measure_s)
  save()
  row["ttft_first_call_s"], row["ttft_compile_s"] = timed_with_compile(lambda: call(ids, 1))
  row["ttft_s"], _ = median_time(lambda: call(ids, 1), a.repeats, a.measure_s)
  row["prefill_s"] = row["ttft_s"]
  decode_s = row["generate_s"] - row["ttft_s"]
  row.update(decode_tokens_per_s=batch * (a.new_tokens - 1) / decode_s,
             step_ms=decode_s / (a.new_tokens - 1) * 1e3, peak_GiB=metrics.device_memory_gib())
  save()


def measure_new_lengths(model, ids: np.ndarray, row: dict, save) -> None:
  """Time to first token on the two prompt lengths of new_lengths, each a prefix of `ids`: both fall
  in the length bucket of `ids` itself, whose program generate(ids, 1) compiled before."""
  row["new_lengths"] = new_lengths(ids.shape[1])
  for key, length in zip(("ttft_new_length", "ttft_same_bucket"), row["new_lengths"]):
    row[f"{key}_s"], row[f"{key}_compile_s"] = timed_with_compile(
        lambda: jax.block_until_ready(generate(model, ids[:, :length], 1)))
    save()


@jax.jit
def _prefill_step(model, tokens, length):
  """The prefill inside generate's program alone: a fresh cache, then HybridLM.step over the whole
  width, with the prompt length traced (`length`, as generate runs it) or not (None)."""
  B, L = tokens.shape
  cache = model.init_cache(B, L + 1)
  return model.step(tokens, cache, last_only=True, fresh=True, length=length)


def profile_prefill(model, ids: np.ndarray, calls: int, path: str) -> None:
  """jax.profiler traces of `calls` prefills of `ids` in three forms, each with its median time
  and per-op table (train_step.profile_table: each op's time a prefill and its HLO / JAX names)
  to `path`: generate with one new token (compiled by the measures before), and the model's
  prefill step alone with the prompt length traced (as generate runs it: each row a prompt and its
  padding, which a mixer without neutral inputs runs as two packed sequences, `layers.common.run_op`)
  and without it (the whole width one sequence), each with its XLA temporary memory."""
  tokens = jax.numpy.asarray(ids)
  forms = {"generate(max_new_tokens=1)": (lambda: generate(model, ids, 1), None)}
  for name, length in (("prefill step, prompt length traced", jax.numpy.int32(ids.shape[1])),
                       ("prefill step, whole width", None)):
    program = _prefill_step.lower(model, tokens, length).compile()
    forms[name] = (lambda program=program, length=length: program(model, tokens, length),
                   program.memory_analysis().temp_size_in_bytes)
  sections = [f"# prefill of {ids.shape[0]} x {ids.shape[1]} tokens, {calls} calls a form\n"]
  for name, (call, temp_bytes) in forms.items():
    temp = "" if temp_bytes is None else f", XLA temporaries {temp_bytes / 2**30:.2f} GiB"
    jax.block_until_ready(call())
    median, _ = median_time(lambda: jax.block_until_ready(call()), calls, 30)
    trace = tempfile.mkdtemp(prefix="prefill_trace_")
    jax.profiler.start_trace(trace)
    for _ in range(calls):
      jax.block_until_ready(call())
    jax.profiler.stop_trace()
    sections.append(f"## {name}: {median * 1e3:.1f} ms{temp}\n\n{profile_table(trace, calls)}\n")
    print(f"{name}: {median * 1e3:.1f} ms{temp}", flush=True)
  with open(path, "w") as f:
    f.write("\n".join(sections))


def run_preset(a, spec: str, path: str) -> list[dict]:
  """Every batch of preset `spec`, then the new prompt lengths at the smallest batch, then with
  --profile a trace of the largest batch's prefill (to `path` with .prefill_profile.md); the rows
  are rewritten to `path` after every measure."""
  rows = []

  def save():
    with open(path, "w") as f:
      json.dump(rows, f, indent=1)

  t = time.perf_counter()
  model = build_model(a, spec)
  jax.block_until_ready(nnx.state(model))
  init_s = time.perf_counter() - t
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) / 1e6
  vocab, rng = model.config.vocab_size, np.random.default_rng(0)
  prompts = {}
  for batch in a.batches:
    row = dict(model=spec, batch=batch, params_M=params, dtype=a.dtype, init_s=init_s,
               attention_layers=len(model.config.attention_indices), device=device(),
               jax=jax.__version__)
    rows.append(row)
    prompts[batch] = rng.integers(0, vocab, (batch, a.prompt), dtype=np.int32)
    try:
      measure(model, prompts[batch], a, row, save)
    except Exception as e:
      row["error"] = f"{type(e).__name__}: {e}"
    save()
    print(json.dumps(row), flush=True)
  first = next(r for r in rows if r["batch"] == min(a.batches))
  if "error" not in first:
    try:
      measure_new_lengths(model, prompts[first["batch"]], first, save)
    except Exception as e:
      first["error"] = f"new prompt lengths: {type(e).__name__}: {e}"
  save()
  if a.profile and "error" not in rows[-1]:
    profile_prefill(model, prompts[rows[-1]["batch"]], a.profile,
                    os.path.splitext(path)[0] + ".prefill_profile.md")
  return rows


def run_each_in_process(a) -> list[dict]:
  """Each preset in a process of its own (this script with --part, one preset and the same other
  flags), at most --preset_timeout seconds: its rows, those written before a timeout included."""
  rows = []
  for spec in a.presets:
    part = part_path(a.out, spec)
    if os.path.exists(part):
      os.remove(part)
    args = [sys.executable, os.path.abspath(__file__), f"--presets={spec}", f"--part={part}",
            f"--batches={','.join(map(str, a.batches))}"]
    args += [f"--{key}={getattr(a, key)}" for key in ("prompt", "new_tokens", "dtype", "repeats",
                                                      "measure_s", "profile")]
    args += [f"--config.{field}={value}" for field, value in a.overrides.items()]
    try:
      failed = subprocess.run(args, check=False, timeout=a.preset_timeout).returncode != 0
      why = "its process failed (its output is above)"
    except subprocess.TimeoutExpired:
      failed, why = True, f"stopped after --preset_timeout={a.preset_timeout:.0f} s"
    found = read_rows(part)
    if failed:
      found = found or [dict(model=spec)]
      for row in found:
        row.setdefault("error", why)
    rows += found
  return rows


def part_path(out: str, spec: str) -> str:
  """The rows file of preset `spec`'s process."""
  return os.path.join(out, "generation." + spec.replace(":", "_") + ".json")


def read_rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)


def device() -> str:
  return f"{jax.devices()[0].device_kind} x {jax.device_count()}"


def define_flags(fv, argv: list[str]) -> None:
  from absl import flags
  from ml_collections import config_flags
  flags.DEFINE_list("presets", ["gated_deltanet_340m_fla", "gated_deltanet_340m_fla:3:1"],
                    "presets to time, each a process of its own; name:3:1 with attn_ratio 3:1",
                    flag_values=fv)
  flags.DEFINE_integer("prompt", 2048, "prompt tokens a row", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("new_tokens", 256, "tokens generated a row (decode is timed over the ones "
                       "after the first)", lower_bound=2, flag_values=fv)
  flags.DEFINE_list("batches", ["1", "64"], "rows a call", flag_values=fv)
  flags.DEFINE_string("dtype", "bfloat16", "weights and activations", flag_values=fv)
  flags.DEFINE_integer("repeats", 3, "calls a measure times at most (their median)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_float("measure_s", 8, "seconds after which a measure stops repeating",
                     lower_bound=0, flag_values=fv)
  flags.DEFINE_integer("profile", 0, "trace this many prefills of the largest batch after its "
                       "measures; per-op table to --out/generation.<preset>.prefill_profile.md",
                       lower_bound=0, flag_values=fv)
  flags.DEFINE_float("preset_timeout", 150, "seconds a preset's process may take", lower_bound=1,
                     flag_values=fv)
  define_torch_flags(fv, "torch_generation", "HF Llama, fla's Gated DeltaNet, fla's 3:1 hybrid",
                     250)
  flags.DEFINE_string("torch_flags", "", "more torch_generation.py flags, e.g. '--head_dim 16' "
                      "(a quick run under Triton's interpreter on a CPU)", flag_values=fv)
  flags.DEFINE_string("torch_python", sys.executable, "the Python (with torch, transformers, fla) "
                      "that runs torch_generation.py", flag_values=fv)
  flags.DEFINE_string("out", os.path.join(os.environ.get("OUT", "."), "generation"),
                      "folder of the JSON and the table", flag_values=fv)
  flags.DEFINE_bool("report", False, "run nothing: the table of the rows files a call left in "
                    "--out (one stopped before its table)", flag_values=fv)
  flags.DEFINE_string("part", None, "(run_each_in_process) time the one preset of --presets in "
                      "this process and write its rows to this file", flag_values=fv)
  config_flags.DEFINE_config_dict(
      "config", ml_collections.ConfigDict(dict(model=benchmark_config().model)),
      "--config.model.<field>=value overrides a ModelConfig field of every preset, e.g. "
      "--config.model.num_layers=4", flag_values=fv, sys_argv=argv)


def parse_args(argv=None) -> types.SimpleNamespace:
  """The flags, with `overrides` the --config.<field> overrides; a bad flag exits with one line
  naming it."""
  from ml_collections import config_flags
  from lineax_lm import cli
  fv = cli.parse(define_flags, argv, "python benchmarks/generation.py", __doc__)
  unknown = [s for s in fv.presets if s.partition(":")[0] not in PRESETS]
  if unknown:
    cli.fail(f"--presets: unknown preset(s) {unknown}; choose from {sorted(PRESETS)}")
  try:
    batches = sorted({int(b) for b in fv.batches})
  except ValueError:
    batches = []
  if not batches or batches[0] < 1:
    cli.fail(f"--batches: a comma-separated list of integers >= 1; got {','.join(fv.batches)!r}")
  if fv.part and len(fv.presets) != 1:
    cli.fail(f"--part: times one preset; got --presets={','.join(fv.presets)}")
  return types.SimpleNamespace(**(fv.flag_values_dict() | dict(
      batches=batches, overrides=config_flags.get_override_values(fv["config"]))))


def torch_command(a) -> list[str]:
  """torch_generation.py's command line for this call's flags."""
  command = [a.torch_python, "torch_generation.py", "--out", a.out, "--prompt", str(a.prompt),
             "--new_tokens", str(a.new_tokens), "--batches", ",".join(map(str, a.batches)),
             "--repeats", str(a.repeats), "--measure_s", str(a.measure_s)]
  for field, flag in (("num_layers", "--layers"), ("hidden", "--hidden"), ("vocab_size", "--vocab")):
    if a.config.model[field] is not None:
      command += [flag, str(a.config.model[field])]
  return (command + (["--models", a.torch_models] if a.torch_models else [])
          + shlex.split(a.torch_flags))


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  a = parse_args(argv)
  if a.part:
    print(f"device: {device()}, jax {jax.__version__}")
    run_preset(a, a.presets[0], a.part)
    return
  os.makedirs(a.out, exist_ok=True)
  torch_json = os.path.join(a.out, "torch_generation.json")
  if a.report:
    rows = [row for spec in a.presets for row in read_rows(part_path(a.out, spec))]
    a.torch = a.torch or torch_json
  else:
    if a.run_torch:  # before JAX's first device call: JAX then takes its share of the free memory
      run_torch_script(torch_command(a), a.out, a.torch_timeout)
      a.torch = torch_json
    rows = run_each_in_process(a)
  theirs = {}
  if a.torch and os.path.exists(a.torch):
    with open(a.torch) as f:
      theirs = json.load(f)
    rows += theirs.get("rows", [])
  elif a.torch:
    print(f"no torch figures: {a.torch} was not written")
  ours = next((r for r in rows if "device" in r), {})
  meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              command=shlex.join(["python3", "benchmarks/generation.py", *argv]), commit=commit(),
              device=ours.get("device"), jax=ours.get("jax"), torch=theirs.get("torch"),
              fla=theirs.get("fla"), torch_device=theirs.get("device"), prompt=a.prompt,
              new_tokens=a.new_tokens, dtype=a.dtype)
  with open(os.path.join(a.out, "generation.json"), "w") as f:
    json.dump(dict(meta, rows=rows), f, indent=1)
  text = table(rows, meta)
  with open(os.path.join(a.out, "generation.md"), "w") as f:
    f.write(text + "\n")
  print("\n" + text)


def commit() -> str:
  """The checkout's commit, "-dirty" where the files differ from it (a copy of a working tree
  whose .git is older than its files reads so too)."""
  try:
    return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                          text=True, check=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def number(x: float) -> str:
  """x with no decimals from 100 up, else with three significant digits."""
  return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def table(rows: list[dict], meta: dict) -> str:
  """The rows as a markdown table, decode and prefill as ratios of fla's Gated DeltaNet's and HF
  Llama's at the same batch."""
  def find(model, batch):
    return next((r for r in rows if r["model"] == model and r.get("batch") == batch
                 and "decode_tokens_per_s" in r), None)

  def ratio(ours, theirs, key, higher_is_faster):
    if not ours or not theirs or key not in ours or key not in theirs:
      return "-"
    return f"{(ours[key] / theirs[key]) if higher_is_faster else (theirs[key] / ours[key]):.2f}x"

  def seconds(r, key, compile_key):
    if key not in r:
      return "-"
    compile_s = r.get(compile_key)
    return f"{r[key]:.2f}" + (f" ({compile_s:.1f})" if compile_s is not None else "")

  torch = (f"; torch {meta['torch']}, fla {meta['fla']} ({meta['torch_device']})" if meta["torch"]
           else "")
  lines = [f"{meta['date']}, {meta['device']}, jax {meta['jax']}{torch}; commit {meta['commit']}",
           f"`{meta['command']}`", "",
           f"Prompt {meta['prompt']} tokens, {meta['new_tokens']} new tokens, greedy, random "
           f"weights, {meta['dtype']}. Decode tokens/s excludes the prefill; ratios: ours over "
           "theirs at the same batch (decode), theirs over ours (prefill); above 1: we are faster. "
           "TTFT new length / same bucket: the first token of prompts of {} then {} tokens, at the "
           "smallest batch after the others (ours: in the prompt's length bucket, whose program "
           "is compiled). Seconds in parentheses: compilation.".format(
               *new_lengths(meta["prompt"])), "",
           "| model | B | prefill ms | prefill vs fla GDN | decode tok/s | vs fla GDN | vs HF Llama | "
           "ms / step | generate s | first call s | TTFT new length s | TTFT same bucket s | "
           "peak GiB |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    name = f"{r['model']} ({number(r['params_M'])}M)" if "params_M" in r else r["model"]
    if "decode_tokens_per_s" not in r:
      error = r.get("error", "no figures")[:200]
      lines.append(f"| {name} | {r.get('batch', '-')} | error: {error} |")
      continue
    fla, llama = find("fla_gated_deltanet_340m", r["batch"]), find("hf_llama_sdpa", r["batch"])
    peak = f"{r['peak_GiB']:.1f}" if r.get("peak_GiB") else "-"
    lines.append(
        f"| {name} | {r['batch']} | {r['prefill_s'] * 1e3:.1f} | "
        f"{ratio(r, fla, 'prefill_s', False)} | "
        f"{number(r['decode_tokens_per_s'])} | {ratio(r, fla, 'decode_tokens_per_s', True)} | "
        f"{ratio(r, llama, 'decode_tokens_per_s', True)} | {r['step_ms']:.2f} | "
        f"{r['generate_s']:.2f} | {seconds(r, 'first_call_s', 'compile_s')} | "
        f"{seconds(r, 'ttft_new_length_s', 'ttft_new_length_compile_s')} | "
        f"{seconds(r, 'ttft_same_bucket_s', 'ttft_same_bucket_compile_s')} | {peak} |"
        + (f" error: {r['error'][:120]}" if "error" in r else ""))
  return "\n".join(lines)


if __name__ == "__main__":
  main()
