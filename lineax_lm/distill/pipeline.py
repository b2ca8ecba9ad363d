"""The distillation pipeline: teacher -> student init -> stages 1..3 (-> SFT) -> evaluation.

    summary = distill(config, workdir)        # config: lineax_lm.distill.config.distill_config()

Workdir layout (rerunning the same command resumes: a finished stage is skipped, an interrupted one
continues from its last checkpoint, teacher samples are reused):
  teacher/                  the runlocal teacher as a HF safetensors directory
  data/                     tokenizer.json (+ tokenizer_config.json), train.jsonl, heldout.jsonl
  1_layer/ 2_block/ 3_e2e/ 4_sft/   one training run each (lineax_lm.train: checkpoints/,
                            metrics.jsonl, tensorboard/); a stage starts from the previous stage's
                            final parameters (stage 1 from `init_student`)
  eval.json                 the final evaluation
  curve.json, curve.png     the maturity curve (config.curve.every > 0): the kept e2e checkpoints
                            scored against tokens trained (the plot when matplotlib is present)

Every stage is one `lineax_lm.train.trainer.train_and_evaluate` run with an `Objective`: the stage's
loss (lineax_lm.distill.losses) with the teacher's parameters as `extra`, the parameters it trains,
and its start. The evaluation compares teacher and student on the held-out teacher samples (and on
`eval.text_paths`, real text, when given): perplexity, the teacher-recovery ratio
teacher_ppl / student_ppl (1 = the student predicts as well as the teacher), and needle-in-a-haystack
accuracy (lineax_lm.eval.ruler's NIAH tasks).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import time

import jax
import ml_collections
import numpy as np
from flax import nnx

from lineax_lm import sharding
from lineax_lm.data.pipeline import make_dataset, make_tokenizer
from lineax_lm.distill import chat, data as distill_data, losses
from lineax_lm.distill.checkpoints import load_teacher, smollm2_gguf_path
from lineax_lm.distill.student import init_student, linear_layers, student_config
from lineax_lm.distill.teacher import save_safetensors_dir, teacher_from_checkpoint, tiny_teacher
from lineax_lm.eval import report
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import abstract_model
from lineax_lm.train import checkpoint, metrics as metrics_lib
from lineax_lm.train.config import base_config
from lineax_lm.train.trainer import Objective, Trainer, raise_if_interrupted, train_and_evaluate

log = logging.getLogger("lineax_lm")
STAGES = ("layer", "block", "e2e", "sft")
TRAINABLE = ("mixers", "linear_blocks", "all")


@dataclasses.dataclass
class Setup:
  """What every stage shares."""
  teacher: nnx.Module
  teacher_cfg: ModelConfig
  student_cfg: ModelConfig
  data: ml_collections.ConfigDict       # the stages' data section (teacher samples by default)
  heldout: str | None                   # held-out teacher samples (jsonl), None with other data
  chat_system: str | None               # the SFT default system message (from the chat template)
  mesh: jax.sharding.Mesh
  folder: str                           # data folder: tokenizer, teacher samples, teacher_eval.json


def stage_dir(workdir: str, stage: str) -> str:
  return os.path.join(workdir, f"{STAGES.index(stage) + 1}_{stage}")


# ----------------------------------------------------------------------------- setup
def load_teacher_checkpoint(config, workdir: str):
  """config.teacher -> TeacherCheckpoint (the tiny teacher is written as HF safetensors first)."""
  if config.teacher.tiny:
    path = os.path.join(workdir, "teacher")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
      save_safetensors_dir(tiny_teacher(seed=config.seed), path)
    return load_teacher(path)
  return load_teacher(config.teacher.path or smollm2_gguf_path())


def setup(config, workdir: str) -> Setup:
  ckpt = load_teacher_checkpoint(config, workdir)
  model_overrides = {k: v for k, v in config.model.to_dict().items() if v is not None}
  teacher, teacher_cfg = teacher_from_checkpoint(ckpt, **model_overrides)
  s = config.student
  student_cfg = student_config(teacher_cfg, s.mixer, s.attn_ratio, s.mixer_cfg.to_dict(),
                               attn_layers=s.attn_layers)
  folder = config.samples.dir or os.path.join(workdir, "data")
  data = ml_collections.ConfigDict(config.data.to_dict())
  if not data.tokenizer:
    if ckpt.tokenizer is None:
      data.tokenizer = "byte"
    else:
      data.tokenizer = distill_data.write_tokenizer(ckpt.tokenizer, folder)
  heldout = None
  if not data.paths:
    os.makedirs(folder, exist_ok=True)
    stops = () if ckpt.tokenizer is None else (ckpt.tokenizer.bos_id, ckpt.tokenizer.eos_id)
    paths = distill_data.ensure_teacher_samples(folder, teacher, data, config.samples, stops)
    data.update(dict(source="jsonl", paths=paths["train"], text_field="text"))
    heldout = paths["heldout"]
  system = config.stages.sft.system
  if system is None and ckpt.tokenizer is not None:
    system = chat.chatml_system(ckpt.tokenizer.chat_template)
  return Setup(teacher, teacher_cfg, student_cfg, data, heldout, system,
               sharding.make_mesh(config.mesh), folder)


# ----------------------------------------------------------------------------- stages
def model_section(model_cfg: ModelConfig) -> ml_collections.ConfigDict:
  d = dataclasses.asdict(model_cfg)
  d["mixer_cfg"] = dict(model_cfg.mixer_cfg)
  return ml_collections.ConfigDict(d)


def stage_config(config, stage: str, st: Setup) -> ml_collections.ConfigDict:
  """The lineax_lm.train config of one stage: the student model, the data, the shared train section
  with the stage's steps / lr / warmup_steps."""
  s = config.stages[stage]
  c = base_config()
  c.seed = config.seed
  c.model = model_section(st.student_cfg)
  c.data = ml_collections.ConfigDict(st.data.to_dict())
  if stage == "sft":
    c.data.update(dict(paths=s.paths, text_field=s.field, seq_len=s.seq_len))
  c.train = ml_collections.ConfigDict(config.train.to_dict())
  c.train.update(dict(steps=s.steps, lr=s.lr, warmup_steps=s.warmup_steps))
  if stage == "e2e" and config.curve.every > 0:  # the maturity curve's points: every one kept
    c.train.update(dict(checkpoint_every=config.curve.every, keep_checkpoints=0))
  c.eval.steps = 0
  c.mesh = ml_collections.ConfigDict(config.mesh.to_dict())
  return c


def trainable_filter(kind: str, model_cfg: ModelConfig):
  """"mixers": the linear layers' mixers; "linear_blocks": the linear layers' whole blocks;
  "all": every parameter (None: nothing frozen)."""
  if kind not in TRAINABLE:
    raise ValueError(f"trainable: must be one of {TRAINABLE}; got {kind!r}")
  if kind == "all":
    return None
  linear = set(linear_layers(model_cfg))
  if kind == "mixers":
    return lambda path: path[0] == "blocks" and path[1] in linear and path[2] == "mixer"
  return lambda path: path[0] == "blocks" and path[1] in linear


def objective(config, stage: str, st: Setup, teacher_params, init_params) -> Objective:
  s = config.stages[stage]
  trainable = trainable_filter(s.trainable, st.student_cfg)
  if stage == "sft":
    if not s.paths:
      raise ValueError("config.stages.sft.paths: the SFT stage needs chat JSON lines (a 'messages' "
                       "list per line); set them or config.stages.sft.steps=0")
    return Objective(init_params=init_params, trainable=trainable,
                     dataset=functools.partial(chat.chat_dataset, default_system=st.chat_system))
  graphdef = nnx.graphdef(st.teacher)
  if stage in ("layer", "block"):
    layers = linear_layers(st.student_cfg)
    if not layers:
      raise ValueError(f"config.student: stage {stage!r} needs linear layers; this student is all "
                       "attention")
    loss = losses.make_loss(stage, graphdef, layers=layers, relative=s.relative)
  else:
    loss = losses.make_loss(stage, graphdef, ce_weight=s.ce_weight, kl_weight=s.kl_weight,
                            temperature=s.temperature)
  return Objective(loss=loss, extra=teacher_params, init_params=init_params, trainable=trainable)


def stage_params(config, stage: str, st: Setup, workdir: str, step: int | None = None):
  """A function () -> the parameters that stage `stage` saved at `step` (None: its latest, the
  final ones of a finished stage), restored with that stage's optimizer layout. The abstract state is built now, outside any mesh context (nnx would
  read the logical axis names as mesh axes inside one); the restore happens when called."""
  cfg = stage_config(config, stage, st)
  trainable = trainable_filter(config.stages[stage].trainable, st.student_cfg)
  abstract = Trainer(cfg, st.student_cfg, st.mesh, Objective(trainable=trainable)).abstract_state()

  def restore():
    with jax.set_mesh(st.mesh):
      mngr = checkpoint.manager(stage_dir(workdir, stage))
      try:
        return checkpoint.restore(mngr, abstract, step=step)[0]["params"]
      finally:
        mngr.close()
  return restore


def finished(config, stage: str, workdir: str) -> bool:
  directory = os.path.join(stage_dir(workdir, stage), "checkpoints")
  if not os.path.isdir(directory):
    return False
  mngr = checkpoint.manager(stage_dir(workdir, stage))
  try:
    return mngr.latest_step() == config.stages[stage].steps
  finally:
    mngr.close()


def place(tree, mesh):
  """Parameters on the mesh by their logical axes (as the trainer shards the student's)."""
  return jax.device_put(tree, sharding.state_shardings(tree, mesh))


def distill(config, workdir: str) -> dict:
  """Runs the stages of `config` in order in `workdir`, then the evaluation; returns its summary."""
  negative = [f"config.stages.{s}.steps={config.stages[s].steps}" for s in STAGES
              if config.stages[s].steps < 0]
  if negative:
    raise ValueError(f"{', '.join(negative)}: must be >= 0 (the stage's training steps; 0 skips it)")
  os.makedirs(workdir, exist_ok=True)
  st = setup(config, workdir)
  teacher_params = previous = None
  trained = False
  for stage in STAGES:
    if config.stages[stage].steps <= 0:
      continue
    if finished(config, stage, workdir):
      log.info("stage %s: finished earlier in %s, skipped", stage, stage_dir(workdir, stage))
      previous = stage
      continue
    if teacher_params is None and stage != "sft":
      teacher_params = place(nnx.state(st.teacher, nnx.Param), st.mesh)
    if previous is None:
      init = lambda: nnx.state(init_student(st.teacher, st.student_cfg, seed=config.student.seed,
                                            conv_init=config.student.conv_init), nnx.Param)
    else:
      init = stage_params(config, previous, st, workdir)
    log.info("stage %s: %d steps in %s", stage, config.stages[stage].steps, stage_dir(workdir, stage))
    raise_if_interrupted(train_and_evaluate(stage_config(config, stage, st), stage_dir(workdir, stage),
                                            objective(config, stage, st, teacher_params, init)),
                         stage_dir(workdir, stage))
    previous, trained = stage, True
  if previous is None:
    raise ValueError("config.stages: every stage has steps = 0; nothing to distil")
  path, key = os.path.join(workdir, "eval.json"), eval_key(config, st)
  if not trained and os.path.exists(path):  # nothing new since the last evaluation
    with open(path, encoding="utf-8") as f:
      summary = json.load(f)
    if summary.get("eval_key") == key and summary.get("final_stage") == previous:
      log.info("evaluation: unchanged since %s, reused", path)
      return with_curve(config, st, workdir, summary)
  student = nnx.merge(nnx.graphdef(abstract_model(st.student_cfg)),
                      stage_params(config, previous, st, workdir)())
  summary = evaluate(config, st, student)
  summary.update(workdir=workdir, final_stage=previous, mixer=st.student_cfg.mixer,
                 attn_ratio=st.student_cfg.attn_ratio, eval_key=key,
                 train_tokens_per_s=train_speeds(workdir))
  report.write_json(path, summary)
  return with_curve(config, st, workdir, summary)


def with_curve(config, st: Setup, workdir: str, summary: dict) -> dict:
  """The summary with the maturity curve's rows (config.curve.every > 0; not part of eval.json)."""
  if config.curve.every > 0:
    summary = {**summary, "curve": maturity_curve(config, st, workdir)}
  return summary


def train_speeds(workdir: str) -> dict:
  """{stage: median logged tokens/s} of the stages run in `workdir` (the first logged window, which
  holds the compilation, left out when there are others)."""
  out = {}
  for stage in STAGES:
    rows = metrics_lib.read_rows(os.path.join(stage_dir(workdir, stage), "metrics.jsonl"))
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    if speeds:
      out[stage] = float(np.median(speeds[1:] or speeds))
  return out


# ----------------------------------------------------------------------------- evaluation
def _eval_batches(data_cfg, seq_len: int, batch_size: int) -> list:
  """One pass over a text source in packed rows of seq_len (the last partial batch dropped)."""
  cfg = ml_collections.ConfigDict(data_cfg.to_dict())
  cfg.update(dict(seq_len=seq_len, global_batch_size=batch_size, num_epochs=1, shuffle=False))
  return list(make_dataset(cfg, seed=0, process_index=jax.process_index(),
                           process_count=jax.process_count()))


def perplexity(config, st: Setup, model, data_cfg) -> float:
  """exp(mean next-token CE) of `model` over one pass of `data_cfg` in packed rows of
  eval.seq_len (documents never see each other): one compiled step per model."""
  e = config.eval
  batches = _eval_batches(data_cfg, e.seq_len, e.batch_size)
  if not batches:
    raise ValueError(f"eval: {data_cfg.paths!r} holds less than one batch of {e.batch_size} rows of "
                     f"{e.seq_len} tokens; lower config.eval.batch_size or seq_len")
  cfg = base_config()
  cfg.model, cfg.data = model_section(model.config), data_cfg
  cfg.mesh = ml_collections.ConfigDict(config.mesh.to_dict())
  trainer = Trainer(cfg, model.config, st.mesh)
  with jax.set_mesh(st.mesh):
    return math.exp(trainer.evaluate(place(nnx.state(model, nnx.Param), st.mesh), batches)["eval_loss"])


def model_metrics(config, st: Setup, model, section=None) -> dict:
  """{"ppl_<set>": perplexity for each evaluation text set, "needle": {"task@length": accuracy},
  "recall": {"mqar@length/kv": accuracy}, "forward_tokens_per_s": ...} under the evaluation
  section `section` (default config.eval; the curve passes a lighter one)."""
  from lineax_lm.eval import mqar, ruler  # lazy: the evaluation package is not needed to train
  from lineax_lm.eval.scoring import Scorer
  e = config.eval if section is None else section
  out = {}
  for name, data_cfg in eval_sets(config, st, e).items():
    out[f"ppl_{name}"] = perplexity(config, st, model, data_cfg)
  # Needles, recall and throughput through one scorer padded to eval.seq_len: one compiled forward
  # for every length (causal models: right padding leaves the scored positions as they are).
  scorer = Scorer(model, e.batch_size, min_length=e.seq_len)
  if e.needle_examples:
    rows = ruler.evaluate_tasks(scorer if e.needle_mode == "teacher_forced" else model,
                                make_tokenizer(st.data), e.needle_tasks,
                                lengths=tuple(e.needle_lengths), num_examples=e.needle_examples,
                                mode=e.needle_mode, batch_size=e.batch_size)
    out["needle"] = {f"{r['task']}@{r['length']}": r["accuracy"] for r in rows}
  if e.get("recall_examples"):
    rows = mqar.mqar_grid(scorer, vocab_size=min(e.recall_vocab, model.config.vocab_size),
                          seq_lens=tuple(e.recall_lengths), kv_pairs=tuple(e.recall_kv),
                          num_examples=e.recall_examples, batch_size=e.batch_size)
    out["recall"] = {f"mqar@{r['seq_len']}/{r['num_kv_pairs']}": r["accuracy"] for r in rows}
  if e.get("throughput"):
    out["forward_tokens_per_s"] = forward_tokens_per_s(scorer, e.seq_len)
  return out


def forward_tokens_per_s(scorer, seq_len: int, repeats: int = 3) -> float:
  """Tokens per second of one forward pass (log-probabilities of the targets, as every scored
  evaluation computes them) of `scorer` (an eval.scoring.Scorer) on [batch_size, seq_len] tokens,
  compiled first, best of `repeats`."""
  batch_size = scorer.batch_size
  tokens = np.random.default_rng(0).integers(0, scorer.model.config.vocab_size, (batch_size, seq_len))
  scorer(tokens, tokens)  # compiles
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    scorer(tokens, tokens)  # returns host arrays: the device has finished
    best = min(best, time.perf_counter() - start)
  return batch_size * seq_len / best


def eval_sets(config, st: Setup, section=None) -> dict:
  """The evaluation texts: held-out teacher samples (with the default data) and the section's
  text_paths (default section: config.eval)."""
  e = config.eval if section is None else section
  sets = {}
  if st.heldout:
    sets["teacher_samples"] = ml_collections.ConfigDict(dict(st.data.to_dict(), paths=st.heldout))
  if e.text_paths:
    sets["text"] = ml_collections.ConfigDict(dict(st.data.to_dict(), source="text",
                                                  paths=e.text_paths, text_unit="file"))
  return sets


# Bumped when the scoring changes, so cached evaluations are redone: 2 = the needle's separator is
# given, not scored (eval.ruler.forced_pair).
EVAL_VERSION = 2


def eval_key(config, st: Setup, section=None) -> str:
  """What an evaluation depends on besides the model: the eval section (default config.eval), the
  text sets and the scoring version."""
  e = config.eval if section is None else section
  return json.dumps([e.to_dict(), {k: v.to_dict() for k, v in eval_sets(config, st, e).items()},
                     EVAL_VERSION], sort_keys=True, default=str)


def teacher_metrics(config, st: Setup, section=None) -> dict:
  """The teacher's `model_metrics`, cached in `<data folder>/teacher_eval.json` per evaluation
  setting, so students that share the data folder (the study's) evaluate the teacher once."""
  key = eval_key(config, st, section)
  cache_path = os.path.join(st.folder, "teacher_eval.json")
  cache = {}
  if os.path.exists(cache_path):
    with open(cache_path, encoding="utf-8") as f:
      cache = json.load(f)
  if key not in cache:
    cache[key] = model_metrics(config, st, st.teacher, section)
    os.makedirs(st.folder, exist_ok=True)
    report.write_json(cache_path, cache)
  return cache[key]


def score_recovery(teacher: dict, student: dict) -> float | None:
  """mean(student scores) / mean(teacher scores) over the same keys (None when the teacher scores
  0 on all of them: nothing to recover; a key the length cannot hold, None, is left out)."""
  keys = [k for k in teacher if teacher[k] is not None and student.get(k) is not None]
  t = sum(teacher[k] for k in keys)
  return sum(student[k] for k in keys) / t if t > 0 else None


def evaluate(config, st: Setup, student) -> dict:
  """Teacher vs student: perplexities, recovery ratios (teacher_ppl / student_ppl), needle and
  recall accuracy with their score recoveries (student / teacher), forward tokens/s and, with
  eval.lm_eval_tasks, lm-eval task scores for both."""
  teacher, mine = teacher_metrics(config, st), model_metrics(config, st, student)
  summary = {}
  for name in mine:
    if name.startswith("ppl_"):
      summary[name] = {"teacher": teacher[name], "student": mine[name]}
      summary["recovery_" + name[4:]] = teacher[name] / mine[name]
  for family in ("needle", "recall"):
    if family in mine:
      summary[family] = {"teacher": teacher[family], "student": mine[family]}
      summary[f"recovery_{family}"] = score_recovery(teacher[family], mine[family])
  if "forward_tokens_per_s" in mine:
    summary["forward_tokens_per_s"] = {"teacher": teacher["forward_tokens_per_s"],
                                       "student": mine["forward_tokens_per_s"]}
  if config.eval.lm_eval_tasks:
    summary["lm_eval"] = lm_eval_scores(config, st, student)
  return summary


def lm_eval_scores(config, st: Setup, student) -> dict:
  """lm-eval scores of teacher and student on eval.lm_eval_tasks in one call (the same tasks,
  limit and adapter settings), with each metric's recovery = student / teacher."""
  from lineax_lm.eval.lm_eval_adapter import evaluate_models
  e = config.eval
  tokenizer = make_tokenizer(st.data)
  results = evaluate_models({"teacher": st.teacher, "student": student}, tokenizer,
                            e.lm_eval_tasks, limit=e.lm_eval_limit,
                            include_path=e.lm_eval_include_path or None, max_length=e.seq_len,
                            batch_size=e.batch_size)
  recovery = {task: {m: (v / results["teacher"][task][m] if results["teacher"][task][m] else None)
                     for m, v in metrics.items()}
              for task, metrics in results["student"].items()}
  return {**results, "recovery": recovery}


def format_summary(summaries: dict) -> str:
  """A table: one row per student (plus the teacher), perplexities, recovery, needle accuracy."""
  first = next(iter(summaries.values()))
  sets = [k[len("ppl_"):] for k in first if k.startswith("ppl_")]
  needles = sorted(first.get("needle", {}).get("teacher", {}))
  head = (["model"] + [f"ppl {s}" for s in sets] + [f"recovery {s}" for s in sets]
          + [f"needle {n}" for n in needles])
  fmt = lambda v: "-" if v is None else f"{v:.3f}"
  rows = [["teacher"] + [fmt(first[f"ppl_{s}"]["teacher"]) for s in sets] + ["1.000"] * len(sets)
          + [fmt(first["needle"]["teacher"][n]) for n in needles]]
  for name, summ in summaries.items():
    rows.append([name] + [fmt(summ[f"ppl_{s}"]["student"]) for s in sets]
                + [fmt(summ[f"recovery_{s}"]) for s in sets]
                + [fmt(summ["needle"]["student"][n]) for n in needles])
  return report.aligned_table(head, rows)


# ----------------------------------------------------------------------------- maturity curve
def curve_section(config) -> ml_collections.ConfigDict:
  """The curve's evaluation: held-out teacher-sample perplexity and config.curve's needle tasks (no
  real text, recall, throughput or lm-eval: each point must stay cheap)."""
  e = ml_collections.ConfigDict(config.eval.to_dict())
  c = config.curve
  e.update(dict(text_paths="", needle_tasks=c.needle_tasks, needle_lengths=tuple(c.needle_lengths),
                needle_examples=c.needle_examples, recall_examples=0, throughput=False,
                lm_eval_tasks=""))
  return e


def maturity_curve(config, st: Setup, workdir: str) -> list[dict]:
  """Rows {"e2e_step", "tokens", "recovery_teacher_samples", "recovery_needle", "needle": {...}}
  for the start of the e2e stage (the block stage's final parameters, or the initial student) and
  every checkpoint the finished e2e stage kept (config.curve.every); `tokens` counts every stage's
  tokens up to that point. Each point is scored once (cached in <workdir>/curve.json, so an
  interrupted curve resumes); curve.png is drawn when matplotlib is importable. [] without a curve."""
  if config.curve.every <= 0 or not finished(config, "e2e", workdir):
    return []
  section = curve_section(config)
  key = eval_key(config, st, section)
  path = os.path.join(workdir, "curve.json")
  saved = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  points = saved.get("points", {}) if saved.get("key") == key else {}
  mngr = checkpoint.manager(stage_dir(workdir, "e2e"), keep=0)
  try:
    steps = sorted(mngr.all_steps())
  finally:
    mngr.close()
  before = [s for s in ("layer", "block") if config.stages[s].steps > 0]
  starts = {0: (before[-1], None) if before else (None, None), **{s: ("e2e", s) for s in steps}}
  teacher = teacher_metrics(config, st, section)
  graphdef = nnx.graphdef(abstract_model(st.student_cfg))
  for step, (stage, at) in starts.items():
    if str(step) in points:
      continue
    if stage is None:
      model = init_student(st.teacher, st.student_cfg, seed=config.student.seed,
                           conv_init=config.student.conv_init)
    else:
      model = nnx.merge(graphdef, stage_params(config, stage, st, workdir, at)())
    points[str(step)] = model_metrics(config, st, model, section)
    report.write_json(path, {"key": key, "teacher": teacher, "points": points})
  tokens_per_step = config.data.global_batch_size * config.data.seq_len
  done = sum(config.stages[s].steps for s in before)
  rows = []
  for step in sorted(map(int, points)):
    m = points[str(step)]
    rows.append(dict(e2e_step=step, tokens=(done + step) * tokens_per_step,
                     recovery_teacher_samples=(teacher["ppl_teacher_samples"]
                                               / m["ppl_teacher_samples"]
                                               if "ppl_teacher_samples" in m else None),
                     recovery_needle=score_recovery(teacher.get("needle", {}), m.get("needle", {})),
                     needle=m.get("needle", {})))
  report.write_json(path, {"key": key, "teacher": teacher, "points": points, "rows": rows})
  plot_curves({st.student_cfg.mixer: rows}, os.path.join(workdir, "curve.png"))
  return rows


def plot_curves(curves: dict, path: str) -> str | None:
  """Recovery (teacher samples) and mean needle accuracy against tokens, one line per student;
  None (nothing drawn) without matplotlib or points."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  curves = {k: v for k, v in curves.items() if v}
  if not curves:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for name, rows in curves.items():
    x = [r["tokens"] / 1e6 for r in rows]
    axes[0].plot(x, [r["recovery_teacher_samples"] for r in rows], marker="o", label=name)
    axes[1].plot(x, [np.mean([v for v in r["needle"].values() if v is not None] or [np.nan])
                     for r in rows], marker="o", label=name)
  for ax, title in zip(axes, ("perplexity recovery (teacher samples)", "needle accuracy (mean)")):
    ax.set_xlabel("tokens trained (M)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
