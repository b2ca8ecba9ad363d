"""The hybrid study's three claims read off a grid's results (claims.md beside tables.md): for each
claim the numbers it is about, and whether this grid agrees by a rule stated next to the verdict.

The rules are deliberately simple, since the papers give no test:
  1. LM quality barely moves with the ratio: the mixer-averaged held-out bits per byte of the five
     ratios (24:1 ... pure) span at most QUALITY_SPAN of their mean (the papers' six-task average
     spans 0.476-0.480, under 1%).
  2. Recall rises with the share of attention up to 3:1: the mixer-averaged recall at 3:1 is at
     least RECALL_RISE above pure, and recall rises with the share across the cells (Spearman's rho
     of share and recall over every linear and hybrid cell above 0). Read on MQAR at its hardest
     scored shape, on the MQAR mean and on the RULER-style mean (rho is left out below three
     cells); a metric that is 0 everywhere cannot tell. Beside the verdict, each metric averaged
     at every ratio and the ratio where it peaks: the study's rise stops near 3:1, and a peak at a
     smaller share says the rise is not steady.
  3. The best standalone mixer is not the best hybrid one: the best mixer at "pure" differs from
     the best at 6:1 (the study's best 340M hybrid ratio; the best at 3:1 is shown beside it), by
     bits per byte and by recall.
Averages over mixers use only the mixers that have every cell compared, so a partial grid reads the
claims on what it has, and says how many mixers that is.
"""
from __future__ import annotations

import numpy as np

from lineax_lm.experiments import sizes as sizes_lib

QUALITY_SPAN = 0.02
RECALL_RISE = 0.05


def _cells(results) -> dict:
  return {(r["mixer"], r["ratio"]): r for r in results}


def mqar_shapes(results) -> list[tuple[int, int]]:
  """The (seq_len, pairs) MQAR shapes scored in any of `results`, shortest and fewest first."""
  return sorted({(m["seq_len"], m["num_kv_pairs"]) for r in results for m in r.get("mqar", ())})


def mqar_accuracy(r, shape) -> float | None:
  """A result's MQAR accuracy at `shape` (seq_len, pairs); None where it was not scored."""
  return next((m["accuracy"] for m in r.get("mqar", ()) if (m["seq_len"], m["num_kv_pairs"]) == shape),
              None)


def _hardest_mqar(results):
  """The longest, most-pairs MQAR shape scored, or None."""
  shapes = mqar_shapes(results)
  return shapes[-1] if shapes else None


def _value(r, metric):
  """metric: a result key, or an MQAR shape (seq_len, pairs)."""
  return mqar_accuracy(r, metric) if isinstance(metric, tuple) else r.get(metric)


def _complete_mixers(cells, ratios, metric) -> list[str]:
  return [m for m in sizes_lib.MIXERS
          if all((m, q) in cells and _value(cells[(m, q)], metric) is not None for q in ratios)]


def _mean_by_ratio(cells, mixers, ratios, metric) -> dict:
  return {q: float(np.mean([_value(cells[(m, q)], metric) for m in mixers])) for q in ratios}


def _fmt(x) -> str:
  return "-" if x is None else f"{x:.3f}"


def _spearman(xs, ys) -> float | None:
  """Spearman's rho (ties share their mean rank); None below three points or for a constant."""
  if len(xs) < 3 or np.ptp(ys) == 0 or np.ptp(xs) == 0:
    return None
  from scipy import stats  # a dependency of jax
  return float(stats.spearmanr(xs, ys).statistic)


def claim_quality(results) -> dict:
  cells, ratios = _cells(results), sizes_lib.RATIOS
  mixers = _complete_mixers(cells, ratios, "heldout_bits_per_byte")
  out = dict(mixers=mixers, by_ratio=None, span=None, verdict="cannot tell: no mixer has every ratio")
  if mixers:
    by_ratio = _mean_by_ratio(cells, mixers, ratios, "heldout_bits_per_byte")
    values = list(by_ratio.values())
    span = (max(values) - min(values)) / float(np.mean(values))
    out.update(by_ratio=by_ratio, span=span,
               verdict="agrees" if span <= QUALITY_SPAN else "disagrees")
  return out


def claim_recall(results, metric) -> dict:
  cells = _cells(results)
  mixers = _complete_mixers(cells, ("pure", "3:1"), metric)
  transformer = cells.get(("transformer", "transformer"))
  linear = [r for r in results if r["mixer"] != "transformer" and _value(r, metric) is not None]
  every_ratio = _complete_mixers(cells, sizes_lib.RATIOS, metric)
  out = dict(metric=metric, mixers=mixers, pure=None, three=None, rho=None,
             transformer=_value(transformer, metric) if transformer else None,
             every_ratio=every_ratio,
             by_ratio=_mean_by_ratio(cells, every_ratio, sizes_lib.RATIOS, metric) if every_ratio else None)
  if mixers:
    ends = _mean_by_ratio(cells, mixers, ("pure", "3:1"), metric)
    rho = _spearman([r["attention_share"] for r in linear], [_value(r, metric) for r in linear])
    out.update(pure=ends["pure"], three=ends["3:1"], rho=rho)
  if linear and not any(_value(r, metric) for r in linear) and not out["transformer"]:
    out["verdict"] = "cannot tell: 0 in every cell"
  elif not mixers:
    out["verdict"] = "cannot tell: no mixer has both its pure and 3:1 cells"
  else:
    rises = out["three"] - out["pure"] >= RECALL_RISE and (out["rho"] is None or out["rho"] > 0)
    out["verdict"] = (f"{'agrees' if rises else 'disagrees'} (over {len(mixers)} "
                      f"mixer{'s' if len(mixers) > 1 else ''})")
  return out


def claim_best_mixer(results, metric, higher_is_better: bool) -> dict:
  cells = _cells(results)
  best = {}
  for q in ("pure", "6:1", "3:1"):
    scored = [(m, _value(cells[(m, q)], metric)) for m in sizes_lib.MIXERS
              if (m, q) in cells and _value(cells[(m, q)], metric) is not None]
    if len(scored) >= 2:
      m, v = (max if higher_is_better else min)(scored, key=lambda p: p[1])
      best[q] = (m, v, len(scored))
  out = dict(metric=metric, best=best)
  if "pure" not in best or "6:1" not in best:
    out["verdict"] = "cannot tell: fewer than two mixers at pure or at 6:1"
  else:
    out["verdict"] = "agrees" if best["pure"][0] != best["6:1"][0] else "disagrees"
  return out


def claims_markdown(results: list[dict]) -> str:
  """claims.md: each claim, its numbers on this grid, and the verdict (rules in the docstring)."""
  label = sizes_lib.label
  lines = ["# The study's claims on this grid\n",
           f"{len(results)} cells. Rules (lineax_lm.experiments.claims): claim 1 agrees when the "
           f"mixer-averaged bits per byte of the five ratios span at most {QUALITY_SPAN:.0%} of "
           f"their mean; claim 2 when recall at 3:1 is at least {RECALL_RISE} above pure and "
           "rises with the share of attention (Spearman's rho > 0); claim 3 when the best mixer "
           "at pure is not the best at 6:1.\n"]
  q = claim_quality(results)
  lines += ["## 1. LM quality barely moves with the ratio\n"]
  if q["by_ratio"]:
    lines += ["| | " + " | ".join(q["by_ratio"]) + " |", "|---" * (len(q["by_ratio"]) + 1) + "|",
              "| held-out bits per byte, mean | " + " | ".join(_fmt(v) for v in q["by_ratio"].values())
              + " |", "",
              f"Over {len(q['mixers'])} mixer(s) ({', '.join(label(m) for m in q['mixers'])}): the "
              f"ratios span {q['span']:.1%} of the mean."]
  lines += [f"\n**Verdict: {q['verdict']}.**\n", "## 2. Recall rises with the share of attention\n",
            "| recall metric | pure | 3:1 | Transformer | Spearman's rho (share, recall) | verdict |",
            "|---|---|---|---|---|---|"]
  hardest = _hardest_mqar(results)
  metrics = ([(hardest, f"MQAR at {hardest[0]} tokens, {hardest[1]} pairs")] if hardest else []) + [
      ("mqar_mean", "MQAR mean"), ("ruler_mean", "RULER-style mean")]
  curves, curve_mixers = [], None  # the shape between the ends: does recall rise "up to 3:1"?
  for metric, name in metrics:
    c = claim_recall(results, metric)
    lines.append(f"| {name} | {_fmt(c.get('pure'))} | {_fmt(c.get('three'))} | {_fmt(c['transformer'])} "
                 f"| {_fmt(c['rho'])} | {c['verdict']} |")
    if c["by_ratio"]:
      values = c["by_ratio"]
      highest = max(values, key=values.get) if np.ptp(list(values.values())) > 0 else "-"
      curves.append(f"| {name} | " + " | ".join(_fmt(v) for v in values.values()) + f" | {highest} |")
      curve_mixers = curve_mixers or c["every_ratio"]
  if curves:
    lines += [f"\nAt every ratio, averaged over the mixers that have all five "
              f"({', '.join(label(m) for m in curve_mixers)}; a metric may have fewer):\n",
              "| recall metric | " + " | ".join(sizes_lib.RATIOS) + " | highest at |",
              "|---" * (len(sizes_lib.RATIOS) + 2) + "|", *curves]
  lines += ["\n(The study at 1.3B, RULER: pure about 0.26, 3:1 about 0.40, Transformer about 0.42.)\n",
            "## 3. The best standalone mixer is not the best hybrid one\n",
            "| metric | best at pure | best at 6:1 | best at 3:1 | verdict |", "|---|---|---|---|---|"]
  for metric, name, higher in [("heldout_bits_per_byte", "held-out bits per byte", False)] + (
      [(hardest, f"MQAR at {hardest[0]} x {hardest[1]}", True)] if hardest else []):
    c = claim_best_mixer(results, metric, higher)
    best = [f"{label(c['best'][q][0])} {_fmt(c['best'][q][1])} (of {c['best'][q][2]})"
            if q in c["best"] else "-" for q in ("pure", "6:1", "3:1")]
    lines.append(f"| {name} | " + " | ".join(best) + f" | {c['verdict']} |")
  lines.append("\n(The study at 340M: HGRN-2 at 6:1 the best hybrid; gated delta-rule mixers with a "
               "forget gate hybridise best.)")
  return "\n".join(lines) + "\n"
