"""Reports: markdown tables, CSV / JSON files and matplotlib PNG plots of result rows (dicts)."""
from __future__ import annotations

import csv
import json
import math
import os
import threading
from typing import Sequence

from lineax_lm.extras import require


def _fmt(value, fmt: str | None = None) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    if math.isnan(value):
      return "nan"
    return (fmt or "{:.4g}").format(value)
  return str(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None,
                   formats: dict | None = None) -> str:
  """A GitHub markdown table of `rows` (dicts); `columns` defaults to the keys of the first row,
  `formats` maps a column to a format string (floats default to 4 significant digits)."""
  if not rows:
    return "(no rows)"
  columns = list(columns or rows[0].keys())
  formats = formats or {}
  lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
  for r in rows:
    lines.append("| " + " | ".join(_fmt(r.get(c), formats.get(c)) for c in columns) + " |")
  return "\n".join(lines)


def aligned_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """A markdown table of already formatted cells, each column padded to its widest cell (readable
  as printed in a terminal, as well as rendered)."""
  widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
  line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
  return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
                   + [line(r) for r in rows])


def pivot_table(rows: Sequence[dict], *, row: str, col: str, value: str, fmt: str = "{:.3f}",
                row_order: Sequence = (), col_order: Sequence = ()) -> str:
  """A markdown table with one line per distinct `row` value and one column per distinct `col` value,
  holding `value`; lines and columns in the given orders (the keys those name that occur, then the
  rest in order of appearance)."""
  def keys(name, order):
    seen = dict.fromkeys(r[name] for r in rows)
    return [k for k in order if k in seen] + [k for k in seen if k not in order]
  rkeys, ckeys = keys(row, row_order), keys(col, col_order)
  cells = {(r[row], r[col]): r[value] for r in rows}
  table = [{row: rk, **{f"{col}={ck}": cells.get((rk, ck)) for ck in ckeys}} for rk in rkeys]
  return markdown_table(table, formats={f"{col}={ck}": fmt for ck in ckeys})


def write_atomically(path: str, write) -> str:
  """Calls `write(f)` on a temporary file beside `path`, then renames it to `path`: a run killed
  mid-write never leaves a half-written file that a resume would trust. The temporary name is the
  writer's own, so processes writing one file at once (a grid's parallel cells updating its
  table) each rename a whole file. Returns `path`."""
  tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
  try:
    with open(tmp, "w", encoding="utf-8", newline="") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path


def write_json(path: str, obj) -> str:
  return write_atomically(path, lambda f: json.dump(obj, f, indent=1, default=float))


def write_rows(rows: Sequence[dict], path_stem: str, columns: Sequence[str] | None = None,
               title: str | None = None, formats: dict | None = None) -> str:
  """Writes `rows` as <stem>.csv, <stem>.json and <stem>.md (markdown table under `title`); returns
  the markdown."""
  os.makedirs(os.path.dirname(os.path.abspath(path_stem)), exist_ok=True)
  columns = list(columns or (rows[0].keys() if rows else []))

  def write_csv(f):
    w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  write_atomically(path_stem + ".csv", write_csv)
  write_json(path_stem + ".json", list(rows))
  md = ((f"## {title}\n\n" if title else "") + markdown_table(rows, columns, formats) + "\n")
  write_atomically(path_stem + ".md", lambda f: f.write(md))
  return md


def _pyplot():
  matplotlib = require("matplotlib", "plotting eval reports")
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def line_plot(rows: Sequence[dict], *, x: str, y: str, group: str, path: str, title: str = "",
              logx: bool = False, ylim=None, err: str | None = None) -> str:
  """One line per distinct `group` value of y against x; saved as a PNG at `path`. `err`: the key
  of each point's error-bar half-width (None or absent: no bar)."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for g in dict.fromkeys(r[group] for r in rows):
    pts = sorted((r[x], r[y], (r.get(err) if err else None) or 0.0)
                 for r in rows if r[group] == g and r[y] is not None)
    line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=str(g))
    if any(p[2] for p in pts):
      ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt="none",
                  ecolor=line.get_color(), capsize=3)
  if logx:
    ax.set_xscale("log", base=2)
  if ylim:
    ax.set_ylim(*ylim)
  ax.set_xlabel(x)
  ax.set_ylabel(y)
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
  """The points (cost, quality) not dominated by a cheaper-or-equal point of higher-or-equal
  quality, sorted by cost."""
  front, best = [], -math.inf
  for c, q in sorted(points, key=lambda p: (p[0], -p[1])):
    if q > best:
      front.append((c, q))
      best = q
  return front


def pareto_plot(rows: Sequence[dict], *, x: str, y: str, label: str, path: str, title: str = "",
                logx: bool = True) -> str:
  """Scatter of quality `y` against cost `x` with each point labelled by `label` and the Pareto front
  (best quality at each cost) drawn as a step line; saved as a PNG at `path`."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  pts = [(float(r[x]), float(r[y])) for r in rows]
  for r, (px, py) in zip(rows, pts):
    ax.scatter(px, py, s=30)
    ax.annotate(str(r[label]), (px, py), fontsize=7, xytext=(3, 3), textcoords="offset points")
  front = pareto_front(pts)
  if front:
    ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="k", alpha=0.5,
            label="Pareto front")
    ax.legend(fontsize=8)
  if logx:
    ax.set_xscale("log")
  ax.margins(x=0.2, y=0.1)                      # room for the labels
  ax.set_xlabel(x)
  ax.set_ylabel(y)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
