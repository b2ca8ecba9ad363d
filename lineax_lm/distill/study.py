"""The linearization study: one teacher, every student, one token budget, one table.

    python -m lineax_lm.distill.study --workdir runs/study [--tokens 2e6] [--only gla,kda]
        [--parallel 4] [--teacher PATH.gguf] [--lm_eval_tasks study] [--hybrid] [--runlocal]

Distils the teacher (default SmolLM2-135M-Instruct) into each student of STUDENTS with the same
budget: `--tokens` per student over the three stages (split by STAGE_SHARE, see `study_config`),
the same teacher samples (joined into documents of at least --seq_len tokens, so the 2,048-token
needle is inside the training length), batch and learning rates. Each student runs in
<workdir>/<student> with lineax_lm.distill.pipeline and is then scored against the teacher:
  - perplexity and its recovery (teacher ppl / student ppl) on held-out teacher samples and on real
    text (the Python Language Reference shipped with CPython, `data.write_reference_text`);
  - needle accuracy, niah_single and niah_multikey at 256 / 512 / 1,024 / 2,048 tokens
    (lineax_lm.eval.ruler, teacher-forced exact match), and its score recovery (student / teacher);
  - MQAR-style in-context recall (lineax_lm.eval.mqar on token ids < 8,192) and its recovery;
  - forward tokens/s (scoring [batch, seq_len]) and the e2e stage's training tokens/s;
  - optionally lm-eval tasks (`--lm_eval_tasks`, "study" = STUDY_LM_EVAL), teacher and student
    through the same adapter call, with per-metric recovery;
  - the maturity curve: the e2e stage keeps a checkpoint every e2e_steps / --curve_points steps and
    each is scored (perplexity recovery, needle at 2,048) against tokens trained (curve.png).
Resumable: a student whose evaluation and curve are complete is not rerun (its eval.json is read),
an interrupted stage resumes from its checkpoint, and a signal (SIGTERM / SIGINT) stops the command
(trainer.Interrupted) after the running stage saved. `--only` runs a subset now; the table lists
every student of `--students` that has finished, so several calls fill one table.
`--parallel N` samples the teacher data and scores the teacher once, then distils N students at a
time in their own processes (logs in <workdir>/<student>/study.log): a student's time on one H200
is mostly compilation on the host's CPU cores (~60 s a stage against ~5-35 s of training at the
default budget), so N processes share the GPU and overlap their compiles.
Writes <workdir>/study.json (table, summaries, curves), study.md (the tables), curves.png and
claims.md (the study's claims judged by lineax_lm.distill.claims' rules).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import types

from absl import flags

from lineax_lm import cli, jobs
from lineax_lm.distill import claims
from lineax_lm.distill import data as distill_data
from lineax_lm.distill.config import STUDENTS, distill_config
from lineax_lm.distill.pipeline import (Distillation, curve_section, distill, plot_curves,
                                        score_recovery)
from lineax_lm.eval import report
from lineax_lm.train.trainer import Interrupted

STAGE_SHARE = {"layer": 0.2, "block": 0.2, "e2e": 0.6}
DEFAULT_TOKENS = 2e6
# The zero-shot suite linearization papers report (LoLCATs, Lizard, the study): lm-eval task names.
STUDY_LM_EVAL = "arc_easy,arc_challenge,hellaswag,piqa,winogrande,lambada_openai"
NEEDLE_TASKS = "niah_single,niah_multikey"
NEEDLE_LENGTHS = (256, 512, 1024, 2048)
DONE = "study_done"  # written in a student's folder once its evaluation and curve are complete


def stage_steps(tokens: float, tokens_per_step: int, shares: dict | None = None) -> dict:
  """{stage: steps} spending `tokens` per student in `shares` proportions (default STAGE_SHARE;
  at least 1 step for a stage with a share, 0 = the stage is skipped)."""
  shares = STAGE_SHARE if shares is None else shares
  if tokens <= 0:
    raise ValueError(f"--tokens: must be > 0; got {tokens}")
  if set(shares) != set(STAGE_SHARE) or min(shares.values()) < 0 or shares["e2e"] <= 0:
    raise ValueError(f"--shares: one non-negative share per stage {tuple(STAGE_SHARE)}, e2e's > 0; "
                     f"got {shares}")
  total = sum(shares.values())
  return {s: max(1, round(share / total * tokens / tokens_per_step)) if share else 0
          for s, share in shares.items()}


def study_config(student: str, tokens: float = DEFAULT_TOKENS, *, batch: int = 4, seq_len: int = 2048,
                 docs: int = 4096, curve_points: int = 3, needle_examples: int = 16,
                 recall_examples: int = 64, shares: dict | None = None, hybrid: bool = False,
                 runlocal: bool = False):
  """The distillation config of one study student. The budget is `tokens` per student; stages get
  STAGE_SHARE of it (steps = share * tokens / (batch * seq_len)), warmup 10% of a stage's steps:

  | stage | share | lr | trains | why |
  |---|---|---|---|---|
  | 1 layer | 0.2 | 1e-3 | the linear mixers only | each mixer learns to reproduce its attention layer's output on the teacher's own inputs: a local regression that converges in ~100-200 steps (0.98 -> 0.19 in 200 steps on the H200) and tolerates a high lr, since nothing else moves |
  | 2 block | 0.2 | 3e-4 | the linear blocks (mixer, norms, MLP) | each block, fed the teacher's h_i, matches h_{i+1}: the MLP adapts to its new mixer; lower lr, the MLPs start right |
  | 3 e2e | 0.6 | 1e-4 | everything | CE + KL to the teacher's logits over the whole network: where the errors that compound across layers are corrected, hence most of the budget; the lowest lr, every weight starts near a good point |

  Stages 1-2 are cheap per step and saturate early, so a larger budget mostly buys e2e steps; with
  `--tokens 3e9` (the study's order of budget) the shares stay the same. Data: `docs` teacher
  samples of <= 512 tokens joined into documents of >= seq_len tokens (reused across epochs when the
  budget exceeds them). Evaluation at seq_len (2,048), needles at NEEDLE_LENGTHS, MQAR at 512
  tokens with 16 and 64 pairs; the curve scores `curve_points` e2e checkpoints plus the start."""
  c = distill_config(student, ",".join(s for s, on in (("hybrid", hybrid), ("runlocal", runlocal)) if on))
  if runlocal:  # the tiny teacher's byte-level world: short rows, short needles
    batch, seq_len = 8, min(seq_len, 64)  # 8: the tests' CPU mesh has 8 devices
    c.samples.update(dict(num_docs=min(docs, 48), heldout_docs=32, max_new_tokens=40))
    c.eval.update(dict(needle_lengths=(384,), recall_lengths=(64,), recall_kv=(4,)))
    c.curve.needle_lengths = (384,)
  else:
    c.model.dtype = "bfloat16"
    # 512 held-out documents, not fewer: the claims' bootstrap resamples their batches.
    c.samples.update(dict(num_docs=docs, heldout_docs=max(512, docs // 8), batch_size=256))
    c.eval.update(dict(needle_lengths=NEEDLE_LENGTHS, batch_size=8))
    c.curve.needle_lengths = (max(NEEDLE_LENGTHS),)
  c.data.update(dict(seq_len=seq_len, global_batch_size=batch))
  c.samples.join_tokens = seq_len
  for stage, steps in stage_steps(tokens, batch * seq_len, shares).items():
    c.stages[stage].update(dict(steps=steps, warmup_steps=max(1, steps // 10)))
  c.eval.update(dict(seq_len=seq_len, needle_tasks=NEEDLE_TASKS, needle_examples=needle_examples,
                     recall_examples=recall_examples, throughput=True))
  c.curve.update(dict(every=max(1, c.stages.e2e.steps // curve_points) if curve_points else 0,
                      needle_examples=max(4, needle_examples // 2)))
  c.train.checkpoint_every = 100  # a signal saves too (the trainer); this bounds a hard kill's loss
  return c


def define_flags(fv: flags.FlagValues, argv) -> None:
  del argv
  flags.DEFINE_string("workdir", None, "the study folder", flag_values=fv)
  flags.DEFINE_string("students", ",".join(STUDENTS), "the study's students (the table)",
                      flag_values=fv)
  flags.DEFINE_string("only", "", "comma-separated subset of --students to run now", flag_values=fv)
  flags.DEFINE_integer("parallel", 1, "students distilled at a time, each in its own process "
                       "(they share the GPU)", lower_bound=1, flag_values=fv)
  # Set by --parallel for its processes: how many students shared the device, so the table can say
  # that their tokens/s were measured on a shared GPU.
  flags.DEFINE_integer("sharing", 1, "(set by --parallel for its processes)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_bool("prepare", False, "only sample the teacher data and score the teacher (what "
                    "students share)", flag_values=fv)
  flags.DEFINE_bool("tables", False, "only write the tables of the students finished so far",
                    flag_values=fv)
  flags.DEFINE_float("tokens", DEFAULT_TOKENS, "training tokens per student over the three stages "
                     "(3e9: the study's budget)", lower_bound=1, flag_values=fv)
  flags.DEFINE_string("teacher", "", "GGUF file or HF directory ('' = the shipped SmolLM2)",
                      flag_values=fv)
  flags.DEFINE_string("shares", ",".join(str(v) for v in STAGE_SHARE.values()),
                      "the budget's split over the layer,block,e2e stages (0 skips a stage)",
                      flag_values=fv)
  flags.DEFINE_integer("batch", 4, "rows per step", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("seq_len", 2048, "tokens per row = training document length", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("docs", 4096, "teacher samples drawn (then joined)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_string("data", "", "train on these text/jsonl files instead of teacher samples",
                      flag_values=fv)
  flags.DEFINE_integer("curve_points", 3, "scored e2e checkpoints (0: no curve)", lower_bound=0,
                       flag_values=fv)
  flags.DEFINE_integer("needle_examples", 16, "needle examples per length", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("recall_examples", 64, "MQAR examples", lower_bound=1, flag_values=fv)
  flags.DEFINE_string("lm_eval_tasks", "", f"lm-eval tasks ('study' = {STUDY_LM_EVAL})",
                      flag_values=fv)
  flags.DEFINE_integer("lm_eval_limit", None, "examples per lm-eval task", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_string("lm_eval_include_path", "", "folder of local lm-eval task YAMLs",
                      flag_values=fv)
  flags.DEFINE_bool("keep_checkpoints", False, "keep every stage's checkpoints of finished "
                    "students (default: the final one)", flag_values=fv)
  flags.DEFINE_bool("hybrid", False, "3:1 hybrid students", flag_values=fv)
  flags.DEFINE_string("needle_control", "", "the folder of a student of the same budget that must "
                      "find the needle (the Gated DeltaNet 3:1 hybrid's: --hybrid --only "
                      "gated_deltanet in another workdir); claims.md reads needle zeros only where "
                      "it scored", flag_values=fv)
  flags.DEFINE_bool("runlocal", False, "tiny random teacher, seconds on CPU", flag_values=fv)
  flags.mark_flag_as_required("workdir", flag_values=fv)

  def students_known(values):
    students = [n.strip() for n in values["students"].split(",") if n.strip()]
    only = [n.strip() for n in values["only"].split(",") if n.strip()]
    unknown = [n for n in students if n not in STUDENTS] + [n for n in only if n not in students]
    if unknown:
      raise flags.ValidationError(f"{unknown} are not study students; choose from "
                                  f"{students if set(students) <= set(STUDENTS) else list(STUDENTS)}")
    return True
  flags.register_multi_flags_validator(["students", "only"], students_known, flag_values=fv)
  flags.register_validator("needle_control", lambda v: not v or os.path.isdir(v),
                           "not a folder (a student's, holding its eval.json)",
                           flag_values=fv)


def parse_args(argv=None):
  """The parsed command line (absl flags, lineax_lm.cli); bad input exits with one line naming
  the flag."""
  fv = cli.parse(define_flags, argv, "python -m lineax_lm.distill.study", __doc__)
  return types.SimpleNamespace(**fv.flag_values_dict())


def names(text: str, allowed) -> list[str]:
  out = [n.strip() for n in text.split(",") if n.strip()]
  unknown = [n for n in out if n not in allowed]
  if unknown:
    raise ValueError(f"students: {unknown} are not study students; choose from {list(allowed)}")
  return out


def parse_shares(text: str) -> dict:
  values = [float(v) for v in text.split(",")]
  if len(values) != len(STAGE_SHARE):
    raise ValueError(f"--shares: give {len(STAGE_SHARE)} numbers (layer,block,e2e); got {text!r}")
  return dict(zip(STAGE_SHARE, values))


def config_for(args, student: str):
  c = study_config(student, args.tokens, batch=args.batch, seq_len=args.seq_len, docs=args.docs,
                   curve_points=args.curve_points, needle_examples=args.needle_examples,
                   recall_examples=args.recall_examples, shares=parse_shares(args.shares),
                   hybrid=args.hybrid, runlocal=args.runlocal)
  c.teacher.path = args.teacher
  c.samples.dir = os.path.join(args.workdir, "data")
  c.eval.text_paths = distill_data.write_reference_text(
      c.samples.dir, max_chars=4_000 if args.runlocal else None)
  if args.data:
    c.data.update(dict(source="jsonl" if args.data.endswith(".jsonl") else "text", paths=args.data))
  tasks = STUDY_LM_EVAL if args.lm_eval_tasks == "study" else args.lm_eval_tasks
  c.eval.update(dict(lm_eval_tasks=tasks, lm_eval_limit=args.lm_eval_limit,
                     lm_eval_include_path=args.lm_eval_include_path))
  return c


def prune_checkpoints(workdir: str) -> None:
  """Deletes a finished student's stage 1-2 checkpoints and the e2e stage's intermediate ones (the
  curve has scored them; the final e2e step stays): ~1.6 GB each at 135M parameters, which eight
  students would otherwise pile up on the device's disk. Metrics and logs stay."""
  from lineax_lm.distill.pipeline import STAGES, stage_dir
  from lineax_lm.train import checkpoint
  for stage in STAGES:
    directory = os.path.join(stage_dir(workdir, stage), "checkpoints")
    if not os.path.isdir(directory):
      continue
    if stage in ("layer", "block"):
      shutil.rmtree(directory)
      continue
    mngr = checkpoint.manager(stage_dir(workdir, stage), keep=0)
    try:
      for step in sorted(mngr.all_steps())[:-1]:
        mngr.delete(step)
    finally:
      mngr.close()


def finished_summary(workdir: str) -> dict | None:
  """The student's final evaluation (eval.json after the e2e stage), None when it has not
  finished (no DONE marker: the evaluation or the curve was interrupted). A finished student is not
  rerun: delete its DONE file to evaluate it again."""
  path = os.path.join(workdir, "eval.json")
  if not os.path.exists(path) or not os.path.exists(os.path.join(workdir, DONE)):
    return None
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  if summary.get("final_stage") != "e2e":
    return None
  with open(os.path.join(workdir, DONE), encoding="utf-8") as f:
    marker = f.read()
  try:  # older markers are a line of text
    summary["sharing"] = json.loads(marker).get("sharing", 1)
  except (json.JSONDecodeError, AttributeError):
    pass
  return summary


def main(argv=None) -> dict:
  args = parse_args(argv)
  logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
  logging.getLogger("lineax_lm").setLevel(logging.INFO)
  students = names(args.students, STUDENTS)
  run_now = [] if args.tables else names(args.only, students) if args.only else students
  if args.prepare:
    return prepare(args, (run_now or students)[0])
  summaries, seconds = {}, {}
  try:
    if args.parallel > 1:
      run_parallel(args, argv, [s for s in run_now if finished_summary(student_dir(args, s)) is None])
      run_now = []  # the processes ran them: below, only their results are read
    run_students(args, students, run_now, summaries, seconds)
  except Interrupted:  # the table of the students finished so far, then stop (rerun to resume)
    write_tables(args, summaries, seconds)
    raise
  return write_tables(args, summaries, seconds)


def student_dir(args, student: str) -> str:
  return os.path.join(args.workdir, student)


def prepare(args, student: str) -> dict:
  """Samples the teacher data into <workdir>/data and scores the teacher (the evaluation and the
  curve's section, cached in data/teacher_eval.json): what every student reads, done once before
  several processes share the workdir. Returns the teacher's evaluation."""
  config = config_for(args, student)
  run = Distillation(config, student_dir(args, student))
  scores = run.teacher_metrics()
  if config.curve.every > 0:
    run.teacher_metrics(curve_section(config))
  print(f"prepared {run.folder}: teacher samples and the teacher's evaluation", flush=True)
  return scores


def run_parallel(args, argv, todo: list[str]) -> None:
  """Distils `todo` with at most args.parallel processes at a time (`--only <student>` each, the
  rest of the command line unchanged), after one `--prepare`; a signal stops them as
  `jobs.run_parallel` says, and then Interrupted is raised."""
  if not todo:
    return
  base = [sys.executable, "-m", "lineax_lm.distill.study"] + jobs.without_flags(
      sys.argv[1:] if argv is None else list(argv), ("--only", "--parallel", "--sharing"))
  subprocess.run(base + ["--prepare", "--only", todo[0]], check=True)
  sharing = ["--sharing", str(min(args.parallel, len(todo)))]
  for student in todo:
    os.makedirs(student_dir(args, student), exist_ok=True)
  try:
    failed = jobs.run_parallel({s: base + ["--only", s] + sharing for s in todo}, args.parallel,
                               lambda s: os.path.join(student_dir(args, s), "study.log"))
  except jobs.Stopped as e:
    raise Interrupted({"stopped_by": signal.Signals(e.signum).name}, args.workdir) from None
  if failed:
    raise RuntimeError(f"students {failed} failed: see their study.log")


def run_students(args, students, run_now, summaries: dict, seconds: dict) -> None:
  """Distils (or reads the evaluation of) each student in order, filling `summaries`."""
  for student in students:
    workdir = os.path.join(args.workdir, student)
    done = finished_summary(workdir)
    if done is None and student in run_now:
      start = time.perf_counter()
      summaries[student] = distill(config_for(args, student), workdir)
      summaries[student]["sharing"] = args.sharing
      seconds[student] = time.perf_counter() - start
      print(f"{student}: {seconds[student]:.0f} s (this invocation)", flush=True)
      if not args.keep_checkpoints:
        prune_checkpoints(workdir)
      with open(os.path.join(workdir, DONE), "w", encoding="utf-8") as f:
        json.dump({"done": "evaluation and curve written", "sharing": args.sharing}, f)
    elif done is not None:
      summaries[student] = done
      curve = os.path.join(workdir, "curve.json")
      if os.path.exists(curve):
        with open(curve, encoding="utf-8") as f:
          summaries[student]["curve"] = json.load(f).get("rows", [])


def write_tables(args, summaries: dict, seconds: dict) -> dict:
  """Prints the tables and writes study.json / study.md / curves.png for `summaries`."""
  if not summaries:
    print("no student has finished yet", flush=True)
    return {}
  tables = format_study(summaries)
  print(tables, flush=True)
  curves = {name: s.get("curve", []) for name, s in summaries.items()}
  plot_curves(curves, os.path.join(args.workdir, "curves.png"))
  report.write_json(os.path.join(args.workdir, "study.json"),
                    {"table": tables, "seconds": seconds, "tokens_per_student": args.tokens,
                     "summaries": summaries})
  with open(os.path.join(args.workdir, "study.md"), "w", encoding="utf-8") as f:
    f.write(tables + "\n")
  control = finished_summary(args.needle_control) if args.needle_control else None
  with open(os.path.join(args.workdir, "claims.md"), "w", encoding="utf-8") as f:
    f.write(claims.claims_markdown(summaries, control, args.needle_control) + "\n")
  return summaries


# ----------------------------------------------------------------------------- the table
def _fmt(v, digits=3):
  return "-" if v is None else f"{v:.{digits}f}"


def _short(key: str) -> str:
  """"niah_single@2048" -> "single@2k", "mqar@512/16" -> "mqar 512/16"."""
  task, _, length = key.partition("@")
  if task == "mqar":
    return f"mqar {length}"
  n = int(length)
  return f"{task.replace('niah_', '')}@{n // 1024}k" if n % 1024 == 0 else f"{task.replace('niah_', '')}@{n}"


def _sorted_keys(d: dict) -> list[str]:
  return sorted(d, key=lambda k: (k.split("@")[0], [int(x) for x in k.split("@")[1].split("/")]))


def format_study(summaries: dict) -> str:
  """The study table (teacher first; every student of `summaries`): perplexity and its recovery per
  text set, needle accuracy per task and length, MQAR recall, score recoveries, tokens/s; then the
  lm-eval table when any summary has one."""
  first = next(iter(summaries.values()))
  sets = [k[len("ppl_"):] for k in first if k.startswith("ppl_")]
  needles = _sorted_keys(first.get("needle", {}).get("teacher", {}))
  recalls = _sorted_keys(first.get("recall", {}).get("teacher", {}))
  head = (["model"] + [f"ppl {s}" for s in sets] + [f"rec {s}" for s in sets]
          + [_short(n) for n in needles] + ["rec needle"] + [_short(r) for r in recalls]
          + ["rec recall", "fwd tok/s", "e2e train tok/s"])
  tput = lambda s, who: s.get("forward_tokens_per_s", {}).get(who)
  own = lambda family: _fmt(score_recovery(first[family]["teacher"], first[family]["teacher"])
                            if family in first else None)  # 1, or "-" where the teacher scores 0
  rows = [["teacher"] + [_fmt(first[f"ppl_{s}"]["teacher"], 2) for s in sets] + ["1.000"] * len(sets)
          + [_fmt(first["needle"]["teacher"][n]) for n in needles] + [own("needle")]
          + [_fmt(first["recall"]["teacher"][r]) for r in recalls] + [own("recall")]
          + [_fmt(tput(first, "teacher"), 0), "-"]]
  for name, s in summaries.items():
    rows.append([name] + [_fmt(s[f"ppl_{t}"]["student"], 2) for t in sets]
                + [_fmt(s[f"recovery_{t}"]) for t in sets]
                + [_fmt(s.get("needle", {}).get("student", {}).get(n)) for n in needles]
                + [_fmt(s.get("recovery_needle"))]
                + [_fmt(s.get("recall", {}).get("student", {}).get(r)) for r in recalls]
                + [_fmt(s.get("recovery_recall")), _fmt(tput(s, "student"), 0),
                   _fmt(s.get("train_tokens_per_s", {}).get("e2e"), 0)])
  out = [report.aligned_table(head, rows)]
  shared = max((s.get("sharing", 1) for s in summaries.values()), default=1)
  if shared > 1:
    out.append(f"tok/s: measured while up to {shared} students shared the device (--parallel "
               f"{shared}), so they rank nothing; a student's own speed needs --parallel 1.")
  with_lm_eval = {n: s["lm_eval"] for n, s in summaries.items() if "lm_eval" in s}
  if with_lm_eval:
    ref = next(iter(with_lm_eval.values()))["teacher"]
    cols = [(t, m) for t in sorted(ref) for m in sorted(ref[t]) if "stderr" not in m]
    head = ["model"] + [f"{t} {m.split(',')[0]}" for t, m in cols] + ["mean recovery"]
    rows = [["teacher"] + [_fmt(ref[t][m]) for t, m in cols] + ["1.000"]]
    for name, r in with_lm_eval.items():
      recs = [r["recovery"][t][m] for t, m in cols if r["recovery"][t][m] is not None]
      rows.append([name] + [_fmt(r["student"][t][m]) for t, m in cols]
                  + [_fmt(sum(recs) / len(recs) if recs else None)])
    out.append(report.aligned_table(head, rows))
  return "\n\n".join(out)


if __name__ == "__main__":
  main()
