"""Times of the chunked ops on the current device, a row per op, backend, shape and segment count:
forward and forward+backward device times, the compile time and peak memory of forward+backward, and
fla's figures with fla/ours ratios when given; optionally the gated delta rule's stage profile and
length scaling, and tile variants of any family's GPU kernels.

    python -m pallas_kernels.bench                        # every op, every backend the device runs
    python -m pallas_kernels.bench --ops gla,hgrn --backends gpu --shapes 4x4096,8x8192 --out DIR
    python -m pallas_kernels.bench --report --fla DIR     # DIR/ops.json's tables, fla beside
    python -m pallas_kernels.bench --report --out DIR --baseline BASE  # another tree's rows beside
        [--profile] [--trace] [--variants] [--scaling] [--segments 1,auto,4] [--interpret]

The ops and the backends that implement them are `dispatch.support_table()`'s: a backend is timed
on the ops whose `chunk_*` its module defines (no fallback), the others are listed as such.
`--backends auto` (the default) is the platform's Pallas backend, where it has one, then xla.
Shapes are BxT with H, K, V from `--hkv`: on an accelerator the anchor 4x4096 and 65,536 tokens a
step (8x8192) at H=16, K=V=128; on CPU 2x1024 at H=4, K=V=64. Inputs as fla's benchmark draws them
(`make_inputs`): `--dtype` q, k, v and float32 gates (HGRN: x, g [B, T, H * K]). Times are device
medians: each of `--reps` repetitions enqueues `--calls` back-to-back calls and divides, so host
dispatch hides behind device work. fwd+bwd differentiates sum(o * do) with respect to every input,
the forward and the backward as two compiled programs (`fwd_bwd`: a program that returns only the
gradients drops the forward's output kernels, which a model and fla's autograd run).
Compile time is the wall time of lowering and compiling both; peak memory is XLA's allocation for
the larger (arguments + outputs + temporaries). --fla DIR reads DIR/fla_ops.json (benchmarks/fla_ops.py);
--baseline DIR reads DIR/ops.json, the rows of another tree timed in the same device call
(benchmarks/ab.sh), and prints its times beside ours as baseline/ours ratios.
--variants times the GPU kernels' tile variants in env VARIANTS (`variants`: e.g.
"warps_wy=8,mlstm:warps_chunk=8") at the first shape. --scaling times the gated delta rule at T in
--lengths, 65,536 tokens a step. With --out every
figure is written to OUT/ops.json as soon as it is measured (what was measured survives a timeout).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
import traceback
import types
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.common import api, dispatch, segments

# family -> the arguments of its chunk op, drawn by `make_inputs`
ARGUMENTS = {
    "linear_attn": ("q", "k", "v"),
    "retention": ("q", "k", "v"),
    "simple_gla": ("q", "k", "v", "gs"),
    "gla": ("q", "k", "v", "gk"),
    "rwkv6": ("q", "k", "v", "gk", "u"),
    "delta_rule": ("q", "kn", "v", "beta"),
    "gated_delta_rule": ("q", "kn", "v", "gs", "beta"),
    "kda": ("q", "kn", "v", "gk", "beta"),
    "hgrn": ("x", "gx"),
    "mlstm": ("q", "k", "v", "i", "f"),
}
# options each op is timed with: fla's benchmark times linear attention without its normalizer
OPTIONS = {"linear_attn": {"normalize": False}}
DEFAULT_VARIANTS = "warps_wy=1,warps_wy_bwd=4"  # `variants`: the gated delta rule's WY kernels
# the families a variant can name: `Timer.op_fn` calls their GPU kernels as (q, k, v, *rest)
VARIANT_FAMILIES = tuple(f for f, names in ARGUMENTS.items() if names[:1] == ("q",))


def op_of(family):
  """(the public chunk op of `family` with its OPTIONS, its argument names)."""
  op = getattr(importlib.import_module(f"pallas_kernels.{family}"), f"chunk_{family}")
  options = OPTIONS.get(family, {})
  return (lambda *a, **kw: op(*a, **options, **kw)), ARGUMENTS[family]


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


def backends_to_time(spec: list[str]) -> list[str]:
  """`--backends`: ["auto"] -> the platform's Pallas backend (where it has one), then xla."""
  if spec != ["auto"]:
    return spec
  platform = dispatch.platform()
  return [platform, "xla"] if platform in dispatch.PALLAS_BACKENDS else ["xla"]


def implements(family: str, backend: str) -> bool:
  """Whether `backend` has its own chunk op for `family` (`dispatch.support_table`; the reference
  backend defines every op)."""
  return backend == "reference" or dispatch.support_table()[family, "chunk", backend]


class Timer:
  """Device medians of `calls` back-to-back calls, over `reps` repetitions; Pallas paths
  interpreted with `interpret` (a CPU smoke test of a GPU or TPU run)."""

  def __init__(self, calls: int = 10, reps: int = 7, interpret: bool = False):
    self.calls, self.reps, self.interpret = calls, reps, interpret

  def device_ms(self, fn, *args):
    return device_ms(fn, *args, calls=self.calls, reps=self.reps)

  def op_fn(self, name, backend, config=None):
    """(function of the op's inputs -> o, argument names) for `backend`; `config` (a tile variant
    of `name`'s GPU kernels, `variants`) calls the family's GPU module directly, from a zero state
    (the public ops take no config)."""
    kw = dict(interpret=True) if self.interpret and backend in dispatch.PALLAS_BACKENDS else {}
    op, names = op_of(name)
    if config is None:
      return (lambda *a: op(*a, backend=backend, **kw)[0]), names
    kernels = getattr(_gpu_module(name), f"chunk_{name}")
    state = getattr(importlib.import_module(f"pallas_kernels.{name}"), "STATE", api.MATRIX)

    def run(q, k, v, *rest):
      d = api.dims(q, k, v, None)
      return kernels(q, k, v, *rest, scale=d.K ** -0.5, initial_state=api.concrete_state(None, state, d),
                     config=config, **kw)[0]
    return run, names

  def time_op(self, name, backend, inputs, config=None, memory=True):
    fn, names = self.op_fn(name, backend, config)
    args = tuple(inputs[n] for n in names)
    fb = fwd_bwd(fn, args)
    row = dict(compile_s=fb.compile_s, fwd_ms=self.device_ms(jax.jit(fn), *args),
               fwdbwd_ms=self.device_ms(fb.step, fb.do, *args))
    if memory:
      row["peak_GiB"] = fb.peak_GiB
      if fb.peak_error:
        row["peak_error"] = fb.peak_error
    return row

  def trace_op(self, name, backend, inputs, trace_dir, calls=5):
    """The device time per kernel of `calls` fwd+bwd calls, from a jax.profiler trace (a markdown
    table: lineax_lm.train.metrics.profile_summary)."""
    from lineax_lm.train.metrics import profile_summary
    fn, names = self.op_fn(name, backend)
    args = tuple(inputs[n] for n in names)
    fb = fwd_bwd(fn, args)
    jax.block_until_ready(fb.step(fb.do, *args))
    jax.profiler.start_trace(trace_dir)
    jax.block_until_ready([fb.step(fb.do, *args) for _ in range(calls)])
    jax.profiler.stop_trace()
    return profile_summary(trace_dir, calls)

  def stage_profile(self, inputs, config=None):
    """Times each GDN kernel alone at the inputs' shape (the forward's and the backward's stages):
    its WY kernels (gated_delta_rule/gpu.py) and the common stages (pallas_kernels/common/gpu/)."""
    from pallas_kernels.common.gpu import chunk_dh, chunk_dqk, chunk_state
    from pallas_kernels.common.gpu.config import CHUNK, DEFAULT, Static
    from pallas_kernels.common.gpu.layout import chunk_cumsum, head_major
    from pallas_kernels.gated_delta_rule import gpu
    cfg = config or DEFAULT
    q, k, v, g, beta = (inputs[n] for n in ("q", "kn", "v", "gs", "beta"))
    B, T, H, K = q.shape
    V = v.shape[-1]
    st = Static(K ** -0.5, False, self.interpret, cfg)
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
    return {name: self.device_ms(jax.jit(f), *a) for name, (f, a) in stages.items()}


class FwdBwd(NamedTuple):
  """The forward+backward a benchmark times (`fwd_bwd`): `step(do, *args)` runs the forward program,
  then the backward program on its residuals, and returns the gradients."""
  step: Callable
  do: jax.Array
  compile_s: float
  peak_GiB: float
  peak_error: str | None


def fwd_bwd(fn, args) -> FwdBwd:
  """The gradient of sum(fn(*args) * do) with respect to every input, as an autograd framework
  runs it: the forward one compiled program returning o and its residuals, the backward another
  taking them and do. In one program that returns only the gradients, o is dead, and XLA drops
  every forward kernel that only o needs: the output and the forward's state pass of an op whose
  backward forms the states again (at K = 256 the gated delta rule's program then launches 7 of
  its 9 kernels). fla's autograd runs the forward whole, as a model does, whose loss reads o.
  Compile time is both programs'; peak memory the larger of the two programs' allocations
  (arguments + outputs + temporaries, less the aliased). do is an argument, not a constant:
  XLA would fold its transposes while compiling, work a training step does at run time."""
  o = jax.eval_shape(fn, *args)
  do = jnp.asarray(np.random.default_rng(1).standard_normal(o.shape, dtype=np.float32), o.dtype)
  t0 = time.perf_counter()
  fwd = jax.jit(forward_program(fn)).lower(*args).compile()
  _, vjp = fwd(*args)
  bwd = jax.jit(backward_program).lower(vjp, do).compile()
  compile_s = time.perf_counter() - t0
  del vjp
  peaks = [peak_gib(c) for c in (fwd, bwd)]
  error = next((e for _, e in peaks if e), None)
  return FwdBwd(lambda do, *a: bwd(fwd(*a)[1], do), do, compile_s,
                max(p for p, _ in peaks) if error is None else float("nan"), error)


def forward_program(fn):
  """What `fwd_bwd` compiles first: args -> (o, the residuals as jax.vjp's function, a pytree)."""
  return lambda *a: jax.vjp(fn, *a)


def backward_program(vjp, do):
  """What `fwd_bwd` compiles second: the residuals and do -> the gradients."""
  return vjp(do)


def peak_gib(compiled) -> tuple[float, str | None]:
  """(peak GiB of a compiled program: arguments, outputs and temporaries less the aliased, None),
  or (NaN, why) where the backend has no memory analysis."""
  try:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes) / 2**30, None
  except Exception as e:  # memory_analysis is not available on every backend
    return float("nan"), repr(e)[:100]


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


def _gpu_module(family):
  return importlib.import_module(f"pallas_kernels.{family}.gpu")


def variants(spec: str) -> tuple[tuple[str, NamedTuple], ...]:
  """(family, its GPU `Config`) pairs to time, from env VARIANTS: "bv_state=16,warps_dqkw=8+bk_dqkw=128,
  mlstm:warps_chunk=8" (',' between variants, '+' between the fields of one; a variant without
  "family:" is the gated delta rule's)."""
  out = []
  for item in spec.split(","):
    family, _, fields = item.rpartition(":")
    family = family or "gated_delta_rule"
    if family not in VARIANT_FAMILIES:
      raise ValueError(f"VARIANTS: {item!r}: tile variants are timed for {list(VARIANT_FAMILIES)}")
    config = getattr(_gpu_module(family), "Config")
    try:
      out.append((family, config(**{k: int(x) for k, x in (kv.split("=") for kv in fields.split("+"))})))
    except (TypeError, ValueError) as e:
      raise ValueError(f"VARIANTS: {item!r}: give {family}'s Config fields as name=integer "
                       f"({', '.join(config._fields)}): {e}") from None
  return tuple(out)


@contextlib.contextmanager
def gpu_defaults(spec: str):
  """Ops traced inside run their GPU kernels on the Configs of `spec` (the VARIANTS syntax, one
  variant a family; "" changes nothing) instead of their defaults: how a whole model's step is
  timed on a variant (benchmarks/train_step.py's "preset#variant")."""
  saved = []
  try:
    for family, config in variants(spec) if spec else ():
      fn = getattr(_gpu_module(family), f"chunk_{family}")
      saved.append((fn, fn.__kwdefaults__["config"]))
      fn.__kwdefaults__["config"] = config
    yield
  finally:
    for fn, config in reversed(saved):
      fn.__kwdefaults__["config"] = config


def load_baseline(d) -> dict:
  """Another tree's rows from DIR/ops.json, by (op, backend, shape, segments); {} without DIR."""
  if not d:
    return {}
  return {_row_key(r): r for r in json.load(open(os.path.join(d, "ops.json")))["rows"]}


def _row_key(r) -> tuple:
  return r["op"], r["backend"], r["shape"], str(r.get("segments", "1"))


def print_baseline(res, base):
  """Our rows beside the baseline's of the same op, backend, shape and segment count."""
  print("\n| op | shape | backend | segments | fwd / fwd+bwd ms | baseline | baseline/ours fwd | "
        "baseline/ours fwd+bwd | peak GiB | baseline peak | compile s | baseline compile |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in res["rows"]:
    b = base.get(_row_key(r), {})
    row = f"| {r['op']} | {r['shape']} | {r['backend']} | {r.get('segments', '1')} |"
    if "error" in r or "fwd_ms" not in b:
      print(f"{row} {(r.get('error') or b.get('error') or 'no baseline row')[:80]} |")
      continue
    print(f"{row} {r['fwd_ms']:.3f} / {r['fwdbwd_ms']:.3f} | {b['fwd_ms']:.3f} / {b['fwdbwd_ms']:.3f} | "
          f"{b['fwd_ms'] / r['fwd_ms']:.3f}x | {b['fwdbwd_ms'] / r['fwdbwd_ms']:.3f}x | "
          f"{r['peak_GiB']:.2f} | {b['peak_GiB']:.2f} | {r['compile_s']:.1f} | {b['compile_s']:.1f} |")


def load_fla(d) -> dict:
  """fla's figures from DIR/fla_ops.json: {op: {"BxT": {fwd_ms, fwdbwd_ms, peak_GiB, ...}}}."""
  path = os.path.join(d or "", "fla_ops.json")
  return json.load(open(path)).get("ops", {}) if d and os.path.exists(path) else {}


def define_flags(fv, argv) -> None:
  """The flags; defaults that depend on the device (shapes, H K V, calls, reps) are None here and
  resolved once jax has picked its platform (`device_defaults`)."""
  from absl import flags
  del argv
  flags.DEFINE_list("ops", list(dispatch.FAMILIES),
                    "op families (pallas_kernels.common.dispatch.FAMILIES); \"\": none", flag_values=fv)
  flags.DEFINE_list("backends", ["auto"],
                    f"auto, or a list of {', '.join((*dispatch.IMPLEMENTATIONS, 'reference'))}",
                    flag_values=fv)
  flags.DEFINE_list("shapes", None, "BxT of the op rows (default: 2x1024 on CPU, 4x4096,8x8192 on "
                    "an accelerator)", flag_values=fv)
  flags.DEFINE_list("hkv", None, "H,K,V (default: 4,64,64 on CPU, 16,128,128 on an accelerator)",
                    flag_values=fv)
  flags.DEFINE_string("dtype", "bfloat16", "of q, k, v (gates are float32)", flag_values=fv)
  flags.DEFINE_integer("calls", None, "back-to-back calls a timing (default: 1 on CPU, 10 on an "
                       "accelerator)", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("reps", None, "timings a median (default: 3 on CPU, 7 on an accelerator)",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_string("fla", None, "a folder with fla_ops.json (benchmarks/fla_ops.py)",
                      flag_values=fv)
  flags.DEFINE_string("out", os.environ.get("OUT"), "write OUT/ops.json (and traces) there "
                      "(default: env OUT, else nowhere)", flag_values=fv)
  flags.DEFINE_bool("profile", False, "GDN stage times at the first shape", flag_values=fv)
  flags.DEFINE_bool("trace", False, "per-kernel device times of every op's fwd+bwd at the first "
                    "shape (jax.profiler)", flag_values=fv)
  flags.DEFINE_bool("variants", False, "tile variants of the GPU kernels (env VARIANTS, default "
                    f"{DEFAULT_VARIANTS!r})", flag_values=fv)
  flags.DEFINE_bool("scaling", False, "the gated delta rule at each T of --lengths",
                    flag_values=fv)
  flags.DEFINE_list("lengths", ["2048", "8192", "32768"],
                    "T values of --scaling (65,536 tokens a step)", flag_values=fv)
  flags.DEFINE_bool("interpret", False, "run the Pallas paths interpreted", flag_values=fv)
  flags.DEFINE_list("segments", ["1"], "segment counts to time each op row at, e.g. 1,auto,4,16 "
                    "(pallas_kernels.common.segments: 1 is the op whole)", flag_values=fv)
  flags.DEFINE_bool("report", False, "only print the tables of OUT/ops.json (default OUT: the "
                    "--fla folder), fla's beside", flag_values=fv)
  flags.DEFINE_string("baseline", None, "a folder with another tree's ops.json from the same device "
                      "call (benchmarks/ab.sh): its rows beside ours", flag_values=fv)


def _integers(name: str, values: list[str], count: int | None = None) -> list[int]:
  """`--name`'s comma list as integers (`count` of them when given); else a one-line error."""
  from lineax_lm import cli
  try:
    numbers = [int(v) for v in values]
  except ValueError:
    cli.fail(f"--{name}: {','.join(values)!r} is not a comma list of integers")
  if count is not None and len(numbers) != count:
    cli.fail(f"--{name}: {','.join(values)!r}: give {count} integers")
  return numbers


def parse_args(argv=None):
  """The parsed flags with the device's defaults filled in and the shapes, H K V, lengths and
  dtype read; a bad value exits with one line naming the flag."""
  # The command line follows the distribution's convention (absl flags, one-line errors, as
  # lineax_lm's commands); the kernels themselves import nothing but jax.
  from lineax_lm import cli
  a = cli.parse(define_flags, argv, "python -m pallas_kernels.bench", __doc__)
  unknown = [o for o in a.ops if o not in ARGUMENTS]
  if unknown:
    cli.fail(f"--ops: unknown op(s) {unknown}; choose from {list(ARGUMENTS)}")
  known = ("auto", *dispatch.IMPLEMENTATIONS, "reference")
  unknown = [b for b in a.backends if b not in known]
  if unknown:
    cli.fail(f"--backends: unknown backend(s) {unknown}; choose from {list(known)}")
  if a.report and not (a.out or a.fla):
    cli.fail("--report prints the tables of OUT/ops.json (default OUT: the --fla folder): "
             "give --out")
  if a.baseline and not os.path.exists(os.path.join(a.baseline, "ops.json")):
    # a baseline that did not run must not read as one
    cli.fail(f"--baseline {a.baseline}: no ops.json there (did the baseline's run fail?)")
  bad = [s for s in a.segments if s != "auto" and not s.isdigit()]
  if bad:
    cli.fail(f"--segments: {bad} are neither counts nor 'auto'")
  try:
    dtype = jnp.dtype(a.dtype).name
  except TypeError:
    cli.fail(f"--dtype: {a.dtype!r} is not a dtype")
  on_cpu = jax.default_backend() == "cpu"
  shapes = a.shapes or (["2x1024"] if on_cpu else ["4x4096", "8x8192"])
  bad = [s for s in shapes if not all(n.isdigit() for n in s.partition("x")[::2])]
  if bad:
    cli.fail(f"--shapes: {bad} are not BxT (e.g. 4x4096)")
  return types.SimpleNamespace(**{
      **a.flag_values_dict(), "dtype": dtype,
      "shapes": [tuple(map(int, s.split("x"))) for s in shapes],
      "hkv": _integers("hkv", a.hkv or (["4", "64", "64"] if on_cpu else ["16", "128", "128"]), 3),
      "lengths": _integers("lengths", a.lengths), "calls": a.calls or (1 if on_cpu else 10),
      "reps": a.reps or (3 if on_cpu else 7)})


def main(argv=None):
  a = parse_args(argv)
  H, K, V = a.hkv
  shapes = a.shapes
  ops = a.ops                                       # --ops "": only what the other flags ask for
  backends = backends_to_time(a.backends)
  timer = Timer(a.calls, a.reps, a.interpret)
  print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
        f"H={H} K={K} V={V} {a.dtype}", flush=True)
  fla, base = load_fla(a.fla), load_baseline(a.baseline)
  if a.report:
    return print_tables(json.load(open(os.path.join(a.out or a.fla, "ops.json"))), fla, base)
  res = dict(rows=[], profile={}, variants=[], scaling=[], traces={})
  if a.out:
    os.makedirs(a.out, exist_ok=True)

  def save():  # after every figure: what was measured survives a timeout of the device call
    if a.out:
      json.dump(res, open(os.path.join(a.out, "ops.json"), "w"), indent=1)

  def run(label, f, *args, **kw):
    try:
      r = f(*args, **kw)
      print(label, r, flush=True)
      return r
    except Exception as e:  # keep going: one failing op must not cost the whole device call
      traceback.print_exc()
      print(label, "ERROR", repr(e)[:300], flush=True)
      return dict(error=repr(e)[:300])

  for B, T in shapes:
    inputs = make_inputs(B, T, H, K, V, jnp.dtype(a.dtype))
    for name in ops:
      for backend in backends:
        if not implements(name, backend):
          res["rows"].append(dict(op=name, backend=backend, shape=f"{B}x{T}",
                                  error=f"no {backend} chunk_{name} (dispatch.support_table)"))
          continue
        for seg in a.segments:
          with segments.segment_parallel(seg if seg == "auto" else int(seg)):  # traced inside
            r = run(f"{name}/{backend} {B}x{T} segments={seg}", timer.time_op, name, backend, inputs)
          res["rows"].append(dict(op=name, backend=backend, shape=f"{B}x{T}", segments=seg, **r))
          save()
    if (B, T) == shapes[0]:
      for name in ops if a.trace else ():
        res["traces"][name] = run(f"trace {name}", timer.trace_op, name, backends[0], inputs,
                                  os.path.join(a.out or ".", f"trace_{name}"))
        save()
      if a.profile:
        res["profile"] = run("profile", timer.stage_profile, inputs) or {}
        save()
      for family, cfg in variants(os.environ.get("VARIANTS", DEFAULT_VARIANTS)) if a.variants else ():
        r = run(f"variant {family} {cfg}", timer.time_op, family, "gpu", inputs, config=cfg,
                memory=False)
        res["variants"].append(dict(op=family, config=cfg._asdict(), **r))
        save()
    del inputs
  for Tl in a.lengths if a.scaling else ():
    inp = make_inputs(65536 // Tl, Tl, H, K, V, jnp.dtype(a.dtype))
    for backend in sorted(backends, key=lambda b: b == "xla"):  # xla last: the slowest
      r = run(f"scaling T={Tl} {backend}", timer.time_op, "gated_delta_rule", backend, inp)
      res["scaling"].append(dict(T=Tl, backend=backend, **r))
      save()
    del inp
  print_tables(res, fla, base)
  return res


def print_tables(res, fla, base=None):
  print("\n| op | shape | backend | segments | fwd ms | fwd+bwd ms | compile s | peak GiB | fla fwd / "
        "fwd+bwd ms | fla/ours fwd | fla/ours fwd+bwd | fla peak GiB |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in res["rows"]:
    if "error" in r:
      print(f"| {r['op']} | {r['shape']} | {r['backend']} | {r.get('segments', '1')} | "
            f"error: {r['error'][:80]} |")
      continue
    f = fla.get(r["op"], {}).get(r["shape"], {})
    ratio = lambda key: f"{f[key] / r[key]:.2f}x" if key in f else "-"
    fla_ms = f"{f['fwd_ms']:.3f} / {f['fwdbwd_ms']:.3f}" if "fwd_ms" in f else f.get("error", "-")[:40]
    print(f"| {r['op']} | {r['shape']} | {r['backend']} | {r.get('segments', '1')} | "
          f"{r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | "
          f"{r['compile_s']:.1f} | {r['peak_GiB']:.2f} | {fla_ms} | {ratio('fwd_ms')} | "
          f"{ratio('fwdbwd_ms')} | {f.get('peak_GiB', '-')} |")
  if base:
    print_baseline(res, base)
  for name, table in res.get("traces", {}).items():
    print(f"\n{name} fwd+bwd, device time per kernel:\n{table}")
  if res["profile"]:
    print("\nGDN stages (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in res["profile"].items()
                                           if isinstance(v, float)))
  for r in res["variants"]:
    family = r.get("op", "gated_delta_rule")
    default = _gpu_module(family).Config()
    print("variant", family, {k: v for k, v in r["config"].items() if v != getattr(default, k)},
          {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
           if k not in ("config", "op")})
  for r in res["scaling"]:
    f = fla.get("gated_delta_rule", {}).get(f"{65536 // r['T']}x{r['T']}", {})
    print("scaling", r, "fla fwd+bwd ms", f.get("fwdbwd_ms", "-"), "fla peak GiB", f.get("peak_GiB", "-"))


if __name__ == "__main__":
  main()
