"""MQAR sweep runner: mixers (with their attention ratios) x model widths x learning rates, each point
trained by `lineax_lm.train.trainer.train_and_evaluate` in its own workdir, then a results table.

  python -m lineax_lm.eval.sweep --config configs/mqar_sweep.py --workdir runs/mqar_sweep

A sweep config (see configs/mqar_sweep.py) holds
  base     a training config (lineax_lm.train.config.base_config() with MQAR data)
  mixers   {label: {"mixer": name, model overrides (attn_ratio, num_layers, ...), "mixer_cfg": {...}}}
  ratios   optional attention ratios ("pure", "3:1", ...) crossed with every mixer entry
  widths   model widths (hidden); heads   linear-mixer heads
  lrs      peak learning rates
  seeds    optional training seeds (init and data order); each (mixer, width, lr) trains once per seed
           and the tables report the mean accuracy over seeds with its min and max
  equal_state  give every matrix-state mixer H heads of key and value dim width / H (state
               H x (width/H)^2 per layer: equal state size at equal width)

Each point writes <workdir>/points/<label>_w<width>_lr<lr>[_s<seed>]/result.json; a rerun skips
finished points and resumes an interrupted one from its checkpoint. Results (Zoology's protocol: the
best accuracy over learning rates for each mixer and width; with seeds, the best mean over seeds) go
to <workdir>/results.{md,csv,json} (every point), best.{md,csv,json}, accuracy_vs_width.png and
pareto.png (accuracy vs token-mixing FLOPs).
"""
from __future__ import annotations

import copy
import json
import os
import re
import time

import ml_collections

from lineax_lm.eval import efficiency, report
from lineax_lm.models.hybrid import abstract_model
from lineax_lm.models.presets import equal_state_mixer_cfg, model_config

def mixer_specs(sweep) -> list[tuple[str, dict]]:
  """(label, spec) pairs: the `mixers` entries, crossed with `ratios` when the sweep has them (label
  "<label>_<ratio>", attn_ratio overridden)."""
  specs = [(label, dict(spec.to_dict() if hasattr(spec, "to_dict") else spec))
           for label, spec in sweep.mixers.items()]
  ratios = sweep.get("ratios")
  if not ratios:
    return specs
  return [(f"{label}_{r}", {**spec, "attn_ratio": r}) for label, spec in specs for r in ratios]


def points(sweep) -> list[dict]:
  """The grid: one dict per (mixer label [x ratio], width, lr[, seed]) with the full training config."""
  out = []
  seeds = list(sweep.get("seeds") or [None])
  for label, spec in mixer_specs(sweep):
    mixer = spec.pop("mixer")
    extra_cfg = dict(spec.pop("mixer_cfg", {}))
    for width in sweep.widths:
      for lr in sweep.lrs:
        for seed in seeds:
          cfg = copy.deepcopy(sweep.base)
          mcfg = equal_state_mixer_cfg(mixer, width, sweep.heads) if sweep.equal_state else {}
          with cfg.unlocked():
            cfg.model.mixer = mixer
            cfg.model.hidden = width
            cfg.model.mixer_cfg = ml_collections.ConfigDict({**mcfg, **extra_cfg})
            for k, v in spec.items():
              cfg.model[k] = v
            cfg.train.lr = float(lr)
            if seed is not None:
              cfg.seed = int(seed)
          name = f"{label}_w{width}_lr{lr:g}" + ("" if seed is None else f"_s{seed}")
          out.append(dict(name=re.sub(r"[^\w.-]", "-", name), label=label, mixer=mixer,
                          width=width, lr=float(lr), seed=cfg.seed,
                          attn_ratio=str(cfg.model.attn_ratio), config=cfg))
  return out


def point_costs(config) -> dict:
  """State size and token-mixing FLOPs per token of a point's model at its training length."""
  model_cfg = model_config(config.model)
  L = config.data.seq_len
  cache = abstract_model(model_cfg).cache_bytes(L)
  costs = efficiency.model_costs(model_cfg, L)
  return dict(params=costs["params"], state_bytes=cache["linear"], kv_cache_bytes=cache["attention"],
              mixing_flops=costs["mixing_flops"])


def run_point(point: dict, workdir: str) -> dict:
  """Trains one point (resuming if interrupted) unless its result.json exists; returns the result.
  A signal during training raises trainer.Interrupted before any result.json is written."""
  from lineax_lm.train.trainer import raise_if_interrupted, train_and_evaluate
  pdir = os.path.join(workdir, "points", point["name"])
  path = os.path.join(pdir, "result.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  start = time.time()
  summary = raise_if_interrupted(train_and_evaluate(point["config"], pdir), pdir)  # a signal ends the sweep
  result = {k: point[k] for k in ("name", "label", "mixer", "width", "lr", "seed", "attn_ratio")}
  result.update(accuracy=summary.get("eval_accuracy"), eval_loss=summary.get("eval_loss"),
                train_loss=summary.get("loss"), steps=summary.get("step"),
                seconds=round(time.time() - start, 1), **point_costs(point["config"]))
  os.makedirs(pdir, exist_ok=True)
  report.write_json(path, result)
  return result


def mean_over_seeds(results: list[dict]) -> list[dict]:
  """One row per (label, width, lr): the first seed's row with `accuracy` the mean over its seeds,
  `accuracy_min`, `accuracy_max` and `seeds` (how many)."""
  groups: dict = {}
  for r in results:
    if r["accuracy"] is not None:
      groups.setdefault((r["label"], r["width"], r["lr"]), []).append(r)
  rows = []
  for group in groups.values():
    accs = [r["accuracy"] for r in group]
    rows.append(dict(group[0], accuracy=sum(accs) / len(accs), accuracy_min=min(accs),
                     accuracy_max=max(accs), seeds=len(accs)))
  return rows


def best_over_lr(results: list[dict]) -> list[dict]:
  """Zoology's protocol: per (label, width), the learning rate of highest accuracy (mean over seeds)."""
  best: dict = {}
  for r in mean_over_seeds(results):
    key = (r["label"], r["width"])
    if key not in best or r["accuracy"] > best[key]["accuracy"]:
      best[key] = r
  return list(best.values())


COLUMNS = ("label", "mixer", "attn_ratio", "width", "lr", "seed", "accuracy", "eval_loss", "steps",
           "params", "state_bytes", "kv_cache_bytes", "mixing_flops", "seconds")


def write_results(results: list[dict], workdir: str) -> str:
  """Tables and plots of the finished points; returns the markdown of the best-over-lr table."""
  if not results:
    return "(no finished points)"
  report.write_rows(results, os.path.join(workdir, "results"), COLUMNS, "MQAR sweep: every point")
  best = best_over_lr(results)
  cols = ("label", "width", "accuracy", "accuracy_min", "accuracy_max", "seeds", "lr", "state_bytes",
          "mixing_flops", "params")
  acc = "{:.3f}"
  md = report.write_rows(best, os.path.join(workdir, "best"), cols,
                         "MQAR sweep: best accuracy over learning rates (mean, min, max over seeds)",
                         formats={"accuracy": acc, "accuracy_min": acc, "accuracy_max": acc,
                                  "lr": "{:g}"})
  report.line_plot(best, x="width", y="accuracy", group="label",
                   path=os.path.join(workdir, "accuracy_vs_width.png"),
                   title="MQAR accuracy (best over lr)", logx=True, ylim=(0, 1.02))
  report.pareto_plot([dict(r, point=f"{r['label']} w{r['width']}") for r in best], x="mixing_flops",
                     y="accuracy", label="point", path=os.path.join(workdir, "pareto.png"),
                     title="MQAR accuracy vs token-mixing FLOPs per token")
  return md


def run_sweep(sweep, workdir: str, progress: bool = True, only: str = "") -> list[dict]:
  """Runs every point not yet finished, then writes the results; returns the results of all points.
  only: a regular expression; just the points whose name it matches (e.g. to share the grid out
  between processes or machines on one workdir; a last run without it writes the full tables)."""
  from tqdm import tqdm
  grid = [p for p in points(sweep) if re.search(only, p["name"])]
  os.makedirs(workdir, exist_ok=True)
  report.write_atomically(os.path.join(workdir, "sweep_config.json"),
                          lambda f: json.dump(sweep.to_dict(), f, indent=1, default=str))
  results = []
  bar = tqdm(grid, unit="point", disable=not progress, dynamic_ncols=True)
  for point in bar:
    bar.set_description(point["name"])
    result = run_point(point, workdir)
    results.append(result)
    bar.set_postfix(acc=f"{result['accuracy']:.3f}" if result["accuracy"] is not None else "-")
    write_results([r for r in results if r["accuracy"] is not None], workdir)
  return results


def main(argv):
  del argv
  from absl import flags
  from absl import logging as absl_logging
  FLAGS = flags.FLAGS
  absl_logging.set_verbosity(absl_logging.WARNING)       # orbax logs every save at INFO
  from lineax_lm import cli
  cli.prepare()
  results = run_sweep(FLAGS.config, FLAGS.workdir, only=FLAGS.only)
  print(write_results(results, FLAGS.workdir))
  print(f"tables and plots in {FLAGS.workdir}")


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", None, "Sweep config file (configs/mqar_sweep.py).")
  flags.DEFINE_string("workdir", None, "Sweep directory (one subfolder per point).")
  flags.DEFINE_string("only", "", "Regular expression: run only the points whose name matches.")
  flags.mark_flags_as_required(["config", "workdir"])
  from lineax_lm import cli
  app.run(main, flags_parser=cli.parse_absl_flags)
