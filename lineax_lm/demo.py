"""The quickstart (`make demo`): train four small models on MQAR and print their recall.

    python -m lineax_lm.demo --workdir runs/demo [--variants gdn,linear,hybrid,transformer]

Each variant of the quickstart config (lineax_lm/configs/quickstart.py) trains with lineax_lm.train in its own subfolder of the
workdir (checkpoints, TensorBoard events, metrics.jsonl; rerunning resumes or skips finished runs),
then the table of held-out MQAR accuracy is printed and written to <workdir>/results.md, with a bar
chart of it in <workdir>/recall.png and the training loss and held-out recall of each model against
the step (from each run's metrics.jsonl) in <workdir>/curves.png. On 2 CPU cores the four take
several minutes; a GPU or TPU is used when present.
"""
from __future__ import annotations

import logging
import os
import sys
import time

import jax
from absl import flags

from lineax_lm import cli
from lineax_lm.extras import available
from lineax_lm.models.presets import model_config
from lineax_lm.train.metrics import curve, read_rows
from lineax_lm.train.trainer import Interrupted, raise_if_interrupted, train_and_evaluate

NAMES = {"gdn": "Gated DeltaNet", "linear": "Linear attention", "hybrid": "Gated DeltaNet 3:1 hybrid",
         "transformer": "Transformer (short conv)"}


def load_quickstart():
  from lineax_lm.configs import quickstart
  return quickstart


def plot_curves(rows, path, plt):
  """Training loss and held-out recall against the step, one line per model."""
  fig, (loss_ax, recall_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
  for r in rows:
    metrics = read_rows(os.path.join(r["workdir"], "metrics.jsonl"))
    loss_ax.plot(*curve(metrics, "loss"), label=r["name"])
    recall_ax.plot(*curve(metrics, "eval_accuracy"), marker=".", label=r["name"])
  loss_ax.set(xlabel="step", ylabel="training loss (cross-entropy on the values)")
  recall_ax.set(xlabel="step", ylabel="MQAR recall accuracy (held-out)", ylim=(0, 1))
  recall_ax.legend(loc="center right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(rows, workdir):
  lines = ["| model | layers (attention) | parameters | MQAR recall accuracy | train time |",
           "|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['name']} | {r['layers']} ({r['attention']}) | {r['params'] / 1e3:.0f}k | "
                 f"{r['accuracy']:.3f} | {r['seconds']:.0f} s |")
  table = "\n".join(lines)
  with open(os.path.join(workdir, "results.md"), "w") as f:
    f.write(f"# Quickstart: MQAR recall (held-out examples)\n\n{table}\n")
  if not available("matplotlib"):
    print("(no recall.png, curves.png: plotting needs matplotlib, pip install 'lineax-lm[plot]')")
    return table
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3))
  ax.barh([r["name"] for r in rows], [r["accuracy"] for r in rows], color="tab:blue")
  ax.set_xlim(0, 1)
  ax.set_xlabel("MQAR recall accuracy")
  ax.invert_yaxis()
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, "recall.png"), dpi=120)
  plt.close(fig)
  plot_curves(rows, os.path.join(workdir, "curves.png"), plt)
  return table


def define_flags(fv: flags.FlagValues, argv) -> None:
  del argv
  flags.DEFINE_string("workdir", "runs/demo", "where each variant trains", flag_values=fv)
  flags.DEFINE_list("variants", list(NAMES), "variants of the quickstart config", flag_values=fv)
  flags.register_validator("variants", lambda v: bool(v) and set(v) <= set(NAMES),
                           f"names a variant that is not one of {','.join(NAMES)}", flag_values=fv)


def main(argv=None):
  a = cli.parse(define_flags, argv, "python -m lineax_lm.demo", __doc__)
  logging.basicConfig(level=logging.INFO, format="%(message)s")
  quickstart = load_quickstart()
  accelerated = jax.default_backend() != "cpu"
  print(f"lineax_lm quickstart on {jax.devices()[0].device_kind}: MQAR, workdir {a.workdir}")
  rows = []
  for variant in a.variants:
    config = quickstart.get_config(variant)
    if accelerated:
      config.model.dtype = "bfloat16"
    print(f"\n== {NAMES[variant]} ({variant}) ==", flush=True)
    start = time.perf_counter()
    run_dir = os.path.join(a.workdir, variant)
    try:
      summary = raise_if_interrupted(train_and_evaluate(config, run_dir), run_dir)
    except Interrupted as stop:  # a signal ends the demo, not one model
      print(stop, flush=True)
      sys.exit(128 + stop.signal.value)
    model = model_config(config.model)
    rows.append(dict(name=NAMES[variant], workdir=run_dir, layers=model.num_layers, attention=len(model.attention_indices),
                     params=summary["num_params"], accuracy=summary.get("eval_accuracy", float("nan")),
                     seconds=time.perf_counter() - start))
  table = write_report(rows, a.workdir)
  print("\nMQAR recall accuracy (held-out examples):\n" + table)
  written = [n for n in ("results.md", "recall.png", "curves.png") if os.path.exists(os.path.join(a.workdir, n))]
  print(f"\nresults: {', '.join(f'{a.workdir}/{n}' for n in written)}; checkpoints under {a.workdir}/<variant>/")


if __name__ == "__main__":
  main()
