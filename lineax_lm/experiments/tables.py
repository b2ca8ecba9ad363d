"""What a grid folder reports: results.{md,csv,json} of every cell, tables.md (mixer x ratio
pivots with 95% intervals over the seeds, per-task RULER, the positive control beside them, the
needle curves), claims.md (lineax_lm.experiments.claims) and the plots."""
from __future__ import annotations

import os

from lineax_lm.eval import report
from lineax_lm.eval.ruler import ruler_means
from lineax_lm.experiments import claims
from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.experiments.cells import load_needle_curves
from lineax_lm.experiments.plots import write_needle_curves, write_plots
from lineax_lm.experiments.scoring import load_control


COLUMNS = ("name", "label", "ratio", "effective_ratio", "attention_share", "heldout_bits_per_byte",
           "heldout_perplexity", "ruler_mean", "mqar_mean", "params", "train_flops", "tokens_per_s",
           "train_seconds", "eval_seconds", "seconds")


def _pivot(results, value, fmt="{:.3f}") -> str:
  """Mixer x ratio of `value`: the mean over a cell's seeds, and with two or more seeds "± the
  half-width of its 95% interval" (claims.interval)."""
  seeds: dict = {}
  for r in results:
    col = "Transformer" if r["mixer"] == "transformer" else r["ratio"]
    seeds.setdefault((r["label"], col), [])
    if r.get(value) is not None:
      seeds[(r["label"], col)].append(r[value])
  rows = []
  for (mixer, col), values in seeds.items():
    text = None
    if values:
      mean, half = claims.interval(values)
      text = fmt.format(mean) + ("" if half is None else " ± " + fmt.format(half))
    rows.append(dict(mixer=mixer, col=col, value=text))
  return report.pivot_table(
      rows, row="mixer", col="col", value="value", fmt="{}",
      row_order=[sizes_lib.label(m) for m in (*sizes_lib.MIXERS, "transformer")],
      col_order=(*sizes_lib.RATIOS, "Transformer")).replace("col=", "")


def needle_curve_markdown(curves: list[dict]) -> str:
  """The needle curves (cells.load_needle_curves) as two tables, the gate's task and the mean of
  the needle tasks, each with a line per cell and length and a column per checkpoint (the
  training tokens it had seen)."""
  curves = [c for c in curves if c["points"]]
  if not curves:
    return ""
  def gate_task(point, length):
    return claims.ruler_accuracy(point, claims.GATE_TASK, length)

  def needle_mean(point, length):
    return ruler_means(point["ruler"]).get(f"ruler_mean_{length}")

  marks = sorted({p["tokens"] for c in curves for p in c["points"]})
  tokens = lambda n: f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"
  parts = []
  for title, value in ((claims.GATE_TASK, gate_task), ("mean of the needle tasks", needle_mean)):
    rows = [dict(line=f"{sizes_lib.cell_label(c['mixer'], c['ratio'], c.get('seed', 0))}, {L:,} "
                 "tokens", tokens=tokens(p["tokens"]), value=value(p, L))
            for c in curves for L in c["settings"]["lengths"] for p in c["points"]]
    parts += [f"\n## Needle accuracy against training tokens: {title}\n",
              report.pivot_table(rows, row="line", col="tokens", value="value",
                                 col_order=[tokens(n) for n in marks]).replace("tokens=", "")]
  return "\n".join(parts)


def tables_markdown(results: list[dict], control: dict | None = None,
                    curves: list[dict] = ()) -> str:
  """The study's tables: LM metric, recall and MQAR by mixer x ratio, and RULER per task, with the
  positive control's RULER-style scores beside them (`score_control`), then the needle curves of
  `curves` (also of cells still training)."""
  if not results:
    return "(no finished cells)\n" + needle_curve_markdown(curves)
  size = results[0].get("size", "?")
  lengths = sorted({row["length"] for r in results for row in r.get("ruler", ())})
  control_line = [] if not control else [  # beside the RULER-style table it controls
      f"\nPositive control, {control['description']}: RULER-style mean "
      f"{claims.fmt(control.get('ruler_mean'))} ("
      + ", ".join(f"{L}: {claims.fmt(control.get(f'ruler_mean_{L}'))}" for L in lengths) + ")."]
  parts = [f"# Hybrid-ratio study, size {size}: {len(results)} cells\n",
           "Columns are the nominal linear:attention ratios; effective ratios at the depth are in "
           "results.md. Lower bits per byte is better; recall and MQAR are accuracies in [0, 1]. A cell "
           "of several seeds shows their mean ± the half-width of its 95% interval.\n",
           "## Held-out bits per byte\n", _pivot(results, "heldout_bits_per_byte"),
           "\n## RULER-style mean (all tasks and lengths)\n", _pivot(results, "ruler_mean"),
           *control_line,
           "\n## MQAR mean (in-context recall of byte pairs; learnt from the data mix when it holds "
           "mqar rows)\n", _pivot(results, "mqar_mean")]
  for L, n in claims.mqar_shapes(results):  # the mean hides which shapes a cell lost
    at_shape = [{**r, "mqar_at_shape": claims.mqar_accuracy(r, (L, n))} for r in results]
    parts += [f"\n## MQAR at {L} tokens, {n} pairs\n", _pivot(at_shape, "mqar_at_shape")]
  for L in lengths:
    parts += [f"\n## RULER-style mean at {L} tokens\n", _pivot(results, f"ruler_mean_{L}")]
  task_rows = [dict(cell=r["name"], **task_means(r)) for r in results]
  if control:
    task_rows.append(dict(cell=f"control: {control['name']}", **task_means(control)))
  parts += ["\n## RULER-style tasks (mean over lengths)\n", report.markdown_table(task_rows),
            needle_curve_markdown(curves)]
  return "\n".join(parts) + "\n"


def task_means(result) -> dict:
  """{task: mean accuracy over the lengths it was scored at} of a result's RULER-style rows."""
  by_task: dict = {}
  for row in result.get("ruler", ()):
    if row["accuracy"] is not None:
      by_task.setdefault(row["task"], []).append(row["accuracy"])
  return {t: sum(v) / len(v) for t, v in by_task.items()}


def write_outputs(results: list[dict], out: str) -> str:
  """results.{md,csv,json}, tables.md, claims.md and the plots; returns tables.md's text."""
  os.makedirs(out, exist_ok=True)
  if results:
    report.write_rows(results, os.path.join(out, "results"), COLUMNS, "Hybrid-ratio study: every cell",
                      formats={"attention_share": "{:.3f}", "train_flops": "{:.3g}"})
  control = load_control(out)
  curves = load_needle_curves(out)
  md = tables_markdown(results, control, curves)
  report.write_atomically(os.path.join(out, "tables.md"), lambda f: f.write(md))
  claims_md = claims.claims_markdown(results, control)
  report.write_atomically(os.path.join(out, "claims.md"), lambda f: f.write(claims_md))
  from lineax_lm.extras import available
  if available("matplotlib"):
    if results:
      write_plots(results, out)
    write_needle_curves(curves, out)
  return md
