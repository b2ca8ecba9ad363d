"""The distillation pipeline: teacher -> student init -> stages 1..3 (-> SFT) -> evaluation.

    summary = distill(config, workdir)        # config: lineax_lm.distill.config.distill_config()

`Distillation(config, workdir)` holds what the stages share (the teacher, the student's config, the
data, the mesh), built once; its methods run a stage, the evaluation and the maturity curve.

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


def stage_dir(workdir: str, stage: str) -> str:
  return os.path.join(workdir, f"{STAGES.index(stage) + 1}_{stage}")


def load_teacher_checkpoint(config, workdir: str):
  """config.teacher -> TeacherCheckpoint (the tiny teacher is written as HF safetensors first)."""
  if config.teacher.tiny:
    path = os.path.join(workdir, "teacher")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
      save_safetensors_dir(tiny_teacher(seed=config.seed), path)
    return load_teacher(path)
  return load_teacher(config.teacher.path or smollm2_gguf_path())


def model_section(model_cfg: ModelConfig) -> ml_collections.ConfigDict:
  d = dataclasses.asdict(model_cfg)
  d["mixer_cfg"] = dict(model_cfg.mixer_cfg)
  return ml_collections.ConfigDict(d)


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
  return Distillation(config, workdir).run()


class Distillation:
  """One distillation run of `config` in `workdir`: what every stage shares, built once (the
  teacher loaded, its samples and tokenizer written to the data folder on first use), and a method
  per stage and per part of the evaluation."""

  def __init__(self, config, workdir: str):
    self.config, self.workdir = config, workdir
    ckpt = load_teacher_checkpoint(config, workdir)
    model_overrides = {k: v for k, v in config.model.to_dict().items() if v is not None}
    self.teacher, teacher_cfg = teacher_from_checkpoint(ckpt, **model_overrides)
    s = config.student
    self.student_cfg = student_config(teacher_cfg, s.mixer, s.attn_ratio, s.mixer_cfg.to_dict(),
                                      attn_layers=s.attn_layers)
    # The data folder: tokenizer, teacher samples, teacher_eval.json.
    self.folder = config.samples.dir or os.path.join(workdir, "data")
    data = ml_collections.ConfigDict(config.data.to_dict())
    if not data.tokenizer:
      if ckpt.tokenizer is None:
        data.tokenizer = "byte"
      else:
        data.tokenizer = distill_data.write_tokenizer(ckpt.tokenizer, self.folder)
    self.heldout = None        # held-out teacher samples (jsonl), None with other data
    if not data.paths:
      os.makedirs(self.folder, exist_ok=True)
      stops = () if ckpt.tokenizer is None else (ckpt.tokenizer.bos_id, ckpt.tokenizer.eos_id)
      paths = distill_data.ensure_teacher_samples(self.folder, self.teacher, data, config.samples,
                                                  stops)
      data.update(dict(source="jsonl", paths=paths["train"], text_field="text"))
      self.heldout = paths["heldout"]
    self.data = data           # the stages' data section (teacher samples by default)
    system = config.stages.sft.system
    if system is None and ckpt.tokenizer is not None:
      system = chat.chatml_system(ckpt.tokenizer.chat_template)
    self.chat_system = system  # the SFT default system message (from the chat template)
    self.mesh = sharding.make_mesh(config.mesh)

  # --------------------------------------------------------------------------- stages
  def stage_dir(self, stage: str) -> str:
    return stage_dir(self.workdir, stage)

  def stage_config(self, stage: str) -> ml_collections.ConfigDict:
    """The lineax_lm.train config of one stage: the student model, the data, the shared train
    section with the stage's steps / lr / warmup_steps."""
    config, s = self.config, self.config.stages[stage]
    c = base_config()
    c.seed = config.seed
    c.model = model_section(self.student_cfg)
    c.data = ml_collections.ConfigDict(self.data.to_dict())
    if stage == "sft":
      c.data.update(dict(paths=s.paths, text_field=s.field, seq_len=s.seq_len))
    c.train = ml_collections.ConfigDict(config.train.to_dict())
    c.train.update(dict(steps=s.steps, lr=s.lr, warmup_steps=s.warmup_steps))
    if stage == "e2e" and config.curve.every > 0:  # the maturity curve's points: every one kept
      c.train.update(dict(checkpoint_every=config.curve.every, keep_checkpoints=0))
    c.eval.steps = 0
    c.mesh = ml_collections.ConfigDict(config.mesh.to_dict())
    return c

  def objective(self, stage: str, teacher_params, init_params) -> Objective:
    s = self.config.stages[stage]
    trainable = trainable_filter(s.trainable, self.student_cfg)
    if stage == "sft":
      if not s.paths:
        raise ValueError("config.stages.sft.paths: the SFT stage needs chat JSON lines (a "
                         "'messages' list per line); set them or config.stages.sft.steps=0")
      return Objective(init_params=init_params, trainable=trainable,
                       dataset=functools.partial(chat.chat_dataset, default_system=self.chat_system))
    graphdef = nnx.graphdef(self.teacher)
    if stage in ("layer", "block"):
      layers = linear_layers(self.student_cfg)
      if not layers:
        raise ValueError(f"config.student: stage {stage!r} needs linear layers; this student is all "
                         "attention")
      loss = losses.make_loss(stage, graphdef, layers=layers, relative=s.relative)
    else:
      loss = losses.make_loss(stage, graphdef, ce_weight=s.ce_weight, kl_weight=s.kl_weight,
                              temperature=s.temperature)
    return Objective(loss=loss, extra=teacher_params, init_params=init_params, trainable=trainable)

  def stage_params(self, stage: str, step: int | None = None):
    """A function () -> the parameters that stage `stage` saved at `step` (None: its latest, the
    final ones of a finished stage), restored with that stage's optimizer layout. The abstract
    state is built now, outside any mesh context (nnx would read the logical axis names as mesh
    axes inside one); the restore happens when called."""
    trainable = trainable_filter(self.config.stages[stage].trainable, self.student_cfg)
    abstract = Trainer(self.stage_config(stage), self.student_cfg, self.mesh,
                       Objective(trainable=trainable)).abstract_state()

    def restore():
      with jax.set_mesh(self.mesh):
        mngr = checkpoint.manager(self.stage_dir(stage))
        try:
          return checkpoint.restore(mngr, abstract, step=step)[0]["params"]
        finally:
          mngr.close()
    return restore

  def finished(self, stage: str) -> bool:
    directory = os.path.join(self.stage_dir(stage), "checkpoints")
    if not os.path.isdir(directory):
      return False
    mngr = checkpoint.manager(self.stage_dir(stage))
    try:
      return mngr.latest_step() == self.config.stages[stage].steps
    finally:
      mngr.close()

  def initial_student(self) -> nnx.Module:
    """The student before stage 1 (lineax_lm.distill.student.init_student)."""
    s = self.config.student
    return init_student(self.teacher, self.student_cfg, seed=s.seed, conv_init=s.conv_init,
                        output_norm_init=s.output_norm_init)

  def train_stages(self) -> tuple[str, bool]:
    """Trains each stage with steps > 0 that is not finished, in order, each from the previous
    stage's final parameters; returns (the last stage, whether any trained now)."""
    config = self.config
    teacher_params = previous = None
    trained = False
    for stage in STAGES:
      if config.stages[stage].steps <= 0:
        continue
      if self.finished(stage):
        log.info("stage %s: finished earlier in %s, skipped", stage, self.stage_dir(stage))
        previous = stage
        continue
      if teacher_params is None and stage != "sft":
        teacher_params = place(nnx.state(self.teacher, nnx.Param), self.mesh)
      if previous is None:
        init = lambda: nnx.state(self.initial_student(), nnx.Param)
      else:
        init = self.stage_params(previous)
      log.info("stage %s: %d steps in %s", stage, config.stages[stage].steps, self.stage_dir(stage))
      raise_if_interrupted(train_and_evaluate(self.stage_config(stage), self.stage_dir(stage),
                                              self.objective(stage, teacher_params, init)),
                           self.stage_dir(stage))
      previous, trained = stage, True
    if previous is None:
      raise ValueError("config.stages: every stage has steps = 0; nothing to distil")
    return previous, trained

  def run(self) -> dict:
    """The stages, then the evaluation (reused from eval.json when nothing trained since and its
    settings are the same); returns its summary."""
    final, trained = self.train_stages()
    path, key = os.path.join(self.workdir, "eval.json"), self.eval_key()
    if not trained:  # nothing new since the last evaluation: eval.json may still hold it
      summary = _read_json(path)
      if summary.get("eval_key") == key and summary.get("final_stage") == final:
        log.info("evaluation: unchanged since %s, reused", path)
        return self.with_curve(summary)
    student = nnx.merge(nnx.graphdef(abstract_model(self.student_cfg)), self.stage_params(final)())
    summary = self.evaluate(student)
    summary.update(workdir=self.workdir, final_stage=final, mixer=self.student_cfg.mixer,
                   attn_ratio=self.student_cfg.attn_ratio, eval_key=key,
                   train_tokens_per_s=train_speeds(self.workdir))
    report.write_json(path, summary)
    return self.with_curve(summary)

  def with_curve(self, summary: dict) -> dict:
    """The summary with the maturity curve's rows (config.curve.every > 0; not part of eval.json)."""
    if self.config.curve.every > 0:
      summary = {**summary, "curve": self.maturity_curve()}
    return summary

  # --------------------------------------------------------------------------- evaluation
  def heldout_loss(self, model, data_cfg) -> dict:
    """{"loss_sum": [...], "count": [...]}: `model`'s summed next-token CE and token count per
    batch over one pass of `data_cfg` in packed rows of eval.seq_len (documents never see each
    other; one compiled step per model). Perplexity is exp(sum(loss_sum) / sum(count)); every model
    is scored on the same batches, so a paired bootstrap over them gives recovery intervals
    (lineax_lm.distill.claims)."""
    e = self.config.eval
    batches = _eval_batches(data_cfg, e.seq_len, e.batch_size)
    if not batches:
      raise ValueError(f"eval: {data_cfg.paths!r} holds less than one batch of {e.batch_size} rows "
                       f"of {e.seq_len} tokens; lower config.eval.batch_size or seq_len")
    cfg = base_config()
    cfg.model, cfg.data = model_section(model.config), data_cfg
    cfg.mesh = ml_collections.ConfigDict(self.config.mesh.to_dict())
    trainer = Trainer(cfg, model.config, self.mesh)
    with jax.set_mesh(self.mesh):
      params = place(nnx.state(model, nnx.Param), self.mesh)
      sums = trainer.batch_sums(params, batches)
    return {k: [float(s[k]) for s in sums] for k in ("loss_sum", "count")}

  def model_metrics(self, model, section=None) -> dict:
    """{"ppl_<set>": perplexity for each evaluation text set, "needle": {"task@length": accuracy},
    "recall": {"mqar@length/kv": accuracy}, "forward_tokens_per_s": ...} under the evaluation
    section `section` (default config.eval; the curve passes a lighter one)."""
    from lineax_lm.eval import mqar, ruler  # lazy: the evaluation package is not needed to train
    from lineax_lm.eval.scoring import Scorer
    e = self.config.eval if section is None else section
    out = {}
    for name, data_cfg in self.eval_sets(e).items():
      out[f"loss_batches_{name}"] = losses = self.heldout_loss(model, data_cfg)
      out[f"ppl_{name}"] = math.exp(sum(losses["loss_sum"]) / max(sum(losses["count"]), 1.0))
    # Needles, recall and throughput through one scorer padded to eval.seq_len: one compiled
    # forward for every length (causal models: right padding leaves the scored positions as they
    # are).
    scorer = Scorer(model, e.batch_size, min_length=e.seq_len)
    if e.needle_examples:
      rows = ruler.evaluate_tasks(scorer if e.needle_mode == "teacher_forced" else model,
                                  make_tokenizer(self.data), e.needle_tasks,
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

  def eval_sets(self, section=None) -> dict:
    """The evaluation texts: held-out teacher samples (with the default data) and the section's
    text_paths (default section: config.eval)."""
    e = self.config.eval if section is None else section
    sets = {}
    if self.heldout:
      sets["teacher_samples"] = ml_collections.ConfigDict(dict(self.data.to_dict(),
                                                               paths=self.heldout))
    if e.text_paths:
      sets["text"] = ml_collections.ConfigDict(dict(self.data.to_dict(), source="text",
                                                    paths=e.text_paths, text_unit="file"))
    return sets

  def eval_key(self, section=None) -> str:
    """What an evaluation depends on besides the model: the eval section (default config.eval),
    the text sets and the scoring version."""
    e = self.config.eval if section is None else section
    return json.dumps([e.to_dict(), {k: v.to_dict() for k, v in self.eval_sets(e).items()},
                       EVAL_VERSION], sort_keys=True, default=str)

  def teacher_metrics(self, section=None) -> dict:
    """The teacher's `model_metrics`, cached in `<data folder>/teacher_eval.json` per evaluation
    setting, so students that share the data folder (the study's) evaluate the teacher once."""
    key = self.eval_key(section)
    cache_path = os.path.join(self.folder, "teacher_eval.json")
    cache = _read_json(cache_path)
    if key not in cache:
      cache[key] = self.model_metrics(self.teacher, section)
      os.makedirs(self.folder, exist_ok=True)
      report.write_json(cache_path, cache)
    return cache[key]

  def evaluate(self, student) -> dict:
    """Teacher vs student: perplexities, recovery ratios (teacher_ppl / student_ppl), needle and
    recall accuracy with their score recoveries (student / teacher), forward tokens/s and, with
    eval.lm_eval_tasks, lm-eval task scores for both."""
    teacher, mine = self.teacher_metrics(), self.model_metrics(student)
    summary = {}
    for name in mine:
      if name.startswith("ppl_"):
        summary[name] = {"teacher": teacher[name], "student": mine[name]}
        summary["recovery_" + name[4:]] = teacher[name] / mine[name]
      elif name.startswith("loss_batches_"):
        summary[name] = {"teacher": teacher[name], "student": mine[name]}
    for family in ("needle", "recall"):
      if family in mine:
        summary[family] = {"teacher": teacher[family], "student": mine[family]}
        summary[f"recovery_{family}"] = score_recovery(teacher[family], mine[family])
    summary["needle_examples"] = self.config.eval.needle_examples
    if "forward_tokens_per_s" in mine:
      summary["forward_tokens_per_s"] = {"teacher": teacher["forward_tokens_per_s"],
                                         "student": mine["forward_tokens_per_s"]}
    if self.config.eval.lm_eval_tasks:
      summary["lm_eval"] = self.lm_eval_scores(student)
    return summary

  def lm_eval_scores(self, student) -> dict:
    """lm-eval scores of teacher and student on eval.lm_eval_tasks in one call (the same tasks,
    limit and adapter settings), with each metric's recovery = student / teacher."""
    from lineax_lm.eval.lm_eval_adapter import evaluate_models
    e = self.config.eval
    results = evaluate_models({"teacher": self.teacher, "student": student},
                              make_tokenizer(self.data), e.lm_eval_tasks, limit=e.lm_eval_limit,
                              include_path=e.lm_eval_include_path or None, max_length=e.seq_len,
                              batch_size=e.batch_size)
    recovery = {task: {m: (v / results["teacher"][task][m] if results["teacher"][task][m] else None)
                       for m, v in metrics.items()}
                for task, metrics in results["student"].items()}
    return {**results, "recovery": recovery}

  # --------------------------------------------------------------------------- maturity curve
  def maturity_curve(self) -> list[dict]:
    """Rows {"e2e_step", "tokens", "recovery_teacher_samples", "recovery_needle", "needle": {...}}
    for the start of the e2e stage (the block stage's final parameters, or the initial student)
    and every checkpoint the finished e2e stage kept (config.curve.every); `tokens` counts every
    stage's tokens up to that point. Each point is scored once (cached in <workdir>/curve.json, so
    an interrupted curve resumes); curve.png is drawn when matplotlib is importable. [] without a
    curve."""
    config = self.config
    if config.curve.every <= 0 or not self.finished("e2e"):
      return []
    section = curve_section(config)
    key = self.eval_key(section)
    path = os.path.join(self.workdir, "curve.json")
    saved = _read_json(path)
    points = saved.get("points", {}) if saved.get("key") == key else {}
    mngr = checkpoint.manager(self.stage_dir("e2e"), keep=0)
    try:
      steps = sorted(mngr.all_steps())
    finally:
      mngr.close()
    before = [s for s in ("layer", "block") if config.stages[s].steps > 0]
    starts = {0: (before[-1], None) if before else (None, None), **{s: ("e2e", s) for s in steps}}
    teacher = self.teacher_metrics(section)
    graphdef = nnx.graphdef(abstract_model(self.student_cfg))
    for step, (stage, at) in starts.items():
      if str(step) in points:
        continue
      if stage is None:
        model = self.initial_student()
      else:
        model = nnx.merge(graphdef, self.stage_params(stage, at)())
      points[str(step)] = self.model_metrics(model, section)
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
                       recovery_needle=score_recovery(teacher.get("needle", {}),
                                                      m.get("needle", {})),
                       needle=m.get("needle", {})))
      if "loss_batches_teacher_samples" in m:  # for the claims' bootstrap over batches
        rows[-1]["loss_batches_teacher_samples"] = {
            "teacher": teacher["loss_batches_teacher_samples"],
            "student": m["loss_batches_teacher_samples"]}
    report.write_json(path, {"key": key, "teacher": teacher, "points": points, "rows": rows})
    plot_curves({self.student_cfg.mixer: rows}, os.path.join(self.workdir, "curve.png"))
    return rows


# ----------------------------------------------------------------------------- helpers
def _read_json(path: str) -> dict:
  """The JSON object in `path`, {} when there is no such file."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


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


def _eval_batches(data_cfg, seq_len: int, batch_size: int) -> list:
  """One pass over a text source in packed rows of seq_len (the last partial batch dropped)."""
  cfg = ml_collections.ConfigDict(data_cfg.to_dict())
  cfg.update(dict(seq_len=seq_len, global_batch_size=batch_size, num_epochs=1, shuffle=False))
  return list(make_dataset(cfg, seed=0, process_index=jax.process_index(),
                           process_count=jax.process_count()))


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


# Bumped when the scoring changes, so cached evaluations are redone: 2 = the needle's separator is
# given, not scored (eval.ruler.forced_pair); 3 = held-out losses kept per batch.
EVAL_VERSION = 3


def score_recovery(teacher: dict, student: dict) -> float | None:
  """mean(student scores) / mean(teacher scores) over the same keys (None when the teacher scores
  0 on all of them: nothing to recover; a key the length cannot hold, None, is left out)."""
  keys = [k for k in teacher if teacher[k] is not None and student.get(k) is not None]
  t = sum(teacher[k] for k in keys)
  return sum(student[k] for k in keys) / t if t > 0 else None


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


def curve_section(config) -> ml_collections.ConfigDict:
  """The curve's evaluation: held-out teacher-sample perplexity and config.curve's needle tasks (no
  real text, recall, throughput or lm-eval: each point must stay cheap)."""
  e = ml_collections.ConfigDict(config.eval.to_dict())
  c = config.curve
  e.update(dict(text_paths="", needle_tasks=c.needle_tasks, needle_lengths=tuple(c.needle_lengths),
                needle_examples=c.needle_examples, recall_examples=0, throughput=False,
                lm_eval_tasks=""))
  return e


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
