"""The grid's plots: each claim's metric against the share of attention layers, held-out bits per
byte against training FLOPs, the training curves and the needle curves (matplotlib, an optional
extra)."""
from __future__ import annotations

import os

from lineax_lm.eval import report
from lineax_lm.experiments import claims
from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.train import metrics as metrics_lib


# Metrics against the share of attention layers: (result key, axis label, file) for the claims.
SHARE_PLOTS = (
    ("ruler_mean", "RULER-style mean", "recall_vs_attention.png"),                   # claim 2
    ("mqar_mean", "MQAR mean", "mqar_vs_attention.png"),                             # claim 2
    ("heldout_bits_per_byte", "held-out bits per byte", "quality_vs_attention.png"),  # claim 1
)


SHARE, INTERVAL = "share of attention layers", "95% interval"


def share_points(results: list[dict], key: str, label: str) -> list[dict]:
  """The points of a SHARE_PLOTS line plot: for each mixer and share of attention, the mean of
  `key` over the cell's seeds (claims.seed_values) as `label` and the half-width of its 95%
  interval (None below two seeds), the Transformer's at share 1 on every mixer's line."""
  seeds = claims.seed_values(results, key)
  shares = {(r["mixer"], r["ratio"]): r["attention_share"] for r in results}
  transformer = seeds.pop(sizes_lib.TRANSFORMER, None)
  points = []
  for mixer in dict.fromkeys(m for m, _ in seeds):
    line = [(shares[cell], values) for cell, values in seeds.items() if cell[0] == mixer]
    for share, values in line + ([(1.0, transformer)] if transformer else []):
      mean, half = claims.interval(values)
      points.append({"mixer": sizes_lib.label(mixer), SHARE: share, label: mean, INTERVAL: half})
  return points


def write_plots(results: list[dict], out: str) -> None:
  """SHARE_PLOTS: each metric against the share of attention layers, one line per mixer (the
  Transformer as share 1 on every line), each point the mean over a cell's seeds with the
  half-width of its 95% interval as an error bar where it has two or more (claims.interval);
  quality_vs_flops.png: held-out bits per byte against training FLOPs."""
  for key, label, name in SHARE_PLOTS:
    rows = share_points(results, key, label)
    if rows:
      title = f"{label} vs share of attention layers\n(mean over seeds, 95% interval)"
      report.line_plot(rows, x=SHARE, y=label, group="mixer", path=os.path.join(out, name),
                       title=title, err=INTERVAL)
  plt = report._pyplot()
  write_quality_vs_flops(results, out, plt)
  write_training_curves(results, out, plt)


def write_quality_vs_flops(results: list[dict], out: str, plt) -> None:
  """quality_vs_flops.png: held-out bits per byte against training FLOPs, a colour per mixer (the
  SHARE_PLOTS' colours: the same grid order) and a marker per ratio, the Transformer a black star.
  Thirty-one labelled points would overlap: the legends name them instead."""
  from matplotlib.lines import Line2D
  # a downloaded checkpoint's training FLOPs are unknown (lineax_lm.experiments.fla_table)
  results = [r for r in results if r.get("heldout_bits_per_byte") is not None
             and r.get("train_flops") is not None]
  if not results:
    return
  mixers = list(dict.fromkeys(r["mixer"] for r in results if r["mixer"] != "transformer"))
  markers = dict(zip(sizes_lib.RATIOS, "osD^v"))
  fig, ax = plt.subplots(figsize=(8.5, 4.5))
  for r in results:
    if r["mixer"] == "transformer":
      style = dict(color="black", marker="*", s=90)
    else:
      style = dict(color=f"C{mixers.index(r['mixer'])}", marker=markers[r["ratio"]], s=30)
    ax.scatter(r["train_flops"], r["heldout_bits_per_byte"], **style)
  point = lambda **kw: Line2D([], [], ls="", **kw)
  by_mixer = [point(color=f"C{i}", marker="o", label=sizes_lib.label(m)) for i, m in enumerate(mixers)]
  by_mixer.append(point(color="black", marker="*", markersize=10, label="Transformer"))
  by_ratio = [point(color="gray", marker=markers[ratio], label=ratio) for ratio in sizes_lib.RATIOS]
  ax.add_artist(ax.legend(handles=by_mixer, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1)))
  ax.legend(handles=by_ratio, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0), title="ratio",
            title_fontsize=7)
  ax.set_xlabel("training FLOPs (forward + backward, estimated)")
  ax.set_ylabel("held-out bits per byte (lower is better)")
  ax.set_title("LM quality vs training compute")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.subplots_adjust(right=0.8)  # room for the legends
  fig.savefig(os.path.join(out, "quality_vs_flops.png"), dpi=120)
  plt.close(fig)


def write_training_curves(results: list[dict], out: str, plt) -> None:
  """training_curves.png: each cell's training loss against the step (its run/metrics.jsonl), a
  panel per mixer with a line per ratio and the Transformer dashed in every panel. With a recall
  mix the loss's sudden fall is where the cell learnt the lookup (MQAR's jump): the scores say
  whether a cell recalls, the curves when it began to and how close a cell that did not came.
  `results` in the grid's order (load_results), so a panel's lines run from 24:1 to pure."""
  loss = {r["name"]: metrics_lib.curve(metrics_lib.read_rows(
      os.path.join(out, "cells", r["name"], "run", "metrics.jsonl")), "loss") for r in results}
  results = [r for r in results if loss[r["name"]][0]]  # a downloaded checkpoint has no run here
  transformer = [r for r in results if r["mixer"] == "transformer"]
  mixers = list(dict.fromkeys(r["mixer"] for r in results if r["mixer"] != "transformer"))
  if not mixers:
    return
  fig, axes = _panels(plt, len(mixers), cols=3, width=4.2, height=3.2)
  for ax, mixer in zip(axes.flat, mixers):
    for r in results:
      if r["mixer"] == mixer:
        # A ratio keeps its colour in every panel, also where a mixer lacks some ratios.
        ax.plot(*loss[r["name"]], label=r["ratio"], lw=1.2,
                color=f"C{sizes_lib.RATIOS.index(r['ratio'])}")
    for r in transformer:
      ax.plot(*loss[r["name"]], label="Transformer", color="black", ls="--", lw=1)
    ax.set_title(sizes_lib.label(mixer), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  _save_panels(plt, fig, axes, "step", "training loss", "Training loss by mixer and ratio",
               os.path.join(out, "training_curves.png"))


def _panels(plt, count: int, cols: int, width: float, height: float):
  """(figure, axes [rows, cols]) of `count` panels with shared axes, at most `cols` a row; the
  panels past `count` hidden."""
  cols = min(cols, count)
  rows = -(-count // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                           sharex=True, sharey=True)
  for ax in axes.flat[count:]:
    ax.set_visible(False)
  return fig, axes


def _save_panels(plt, fig, axes, xlabel: str, ylabel: str, title: str, path: str) -> None:
  """Labels the outer panels of `_panels`, titles the figure and saves it to `path`."""
  for ax in axes[-1]:
    ax.set_xlabel(xlabel)
  for ax in axes[:, 0]:
    ax.set_ylabel(ylabel)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_needle_curves(curves: list[dict], out: str) -> None:
  """needle_curve.png: each needle task's accuracy against the training tokens its checkpoint had
  seen (cells.load_needle_curves), a panel per task, a colour per cell and a line style per
  length; the slice gate's threshold dotted in its task's panel. Nothing without a scored point."""
  curves = [c for c in curves if c["points"]]
  if not curves:
    return
  plt = report._pyplot()
  tasks = curves[0]["settings"]["tasks"]
  lengths = sorted({L for c in curves for L in c["settings"]["lengths"]})
  styles = dict(zip(lengths, ("-", "--", ":", "-.")))
  fig, axes = _panels(plt, len(tasks), cols=2, width=5.2, height=3.4)
  for ax, task in zip(axes.flat, tasks):
    for i, c in enumerate(curves):
      name = sizes_lib.cell_label(c["mixer"], c["ratio"], c.get("seed", 0))
      for L in c["settings"]["lengths"]:
        points = [(p["tokens"] / 1e6, claims.ruler_accuracy(p, task, L)) for p in c["points"]]
        points = [(x, y) for x, y in points if y is not None]
        if points:
          ax.plot(*zip(*points), marker="o", ms=3, color=f"C{i}", ls=styles.get(L, "-"),
                  label=f"{name}, {L:,}")
    if task == claims.GATE_TASK:
      ax.axhline(claims.GATE_THRESHOLD, color="gray", ls=":", lw=1,
                 label=f"gate ({claims.GATE_LENGTH:,} tokens)")
    ax.set_title(task, fontsize=10)
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
  axes.flat[0].legend(fontsize=6, loc="upper left")
  _save_panels(plt, fig, axes, "training tokens (M)", "accuracy",
               "Needle accuracy against training tokens (a line per cell and length)",
               os.path.join(out, "needle_curve.png"))
