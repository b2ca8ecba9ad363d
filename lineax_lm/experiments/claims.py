"""The hybrid study's three claims read off a grid's results (claims.md beside tables.md), each by a
rule fixed here before the runs it judges, with the data it read and a 95% interval.

A cell's value is the mean over its seeds; intervals come from a bootstrap (`BOOTSTRAP` resamples,
a fixed generator): a cell's seeds are resampled within the cell, and a statistic over cells (a
rank correlation) resamples the (share, value) points of every seed of every cell. With one seed a
cell's resamples are all equal: the interval shows only the spread between cells, and claim 3,
which compares mixers at one ratio, needs at least `MIN_SEEDS` seeds to give a verdict.

  1. LM quality barely moves with the ratio. Agrees when every mixer that has all five ratios
     spans at most QUALITY_SPAN of its mean held-out bits per byte across them (24:1 ... pure;
     the span of the seed means, its 95% interval beside); disagrees when any mixer's span
     exceeds it. Read per mixer, since a mixer average can hide one mixer that moves.
  2. Recall rises with the share of attention up to 3:1 (the study: "recall significantly improves
     with increased full attention layers, particularly below a 3:1 ratio"). Per recall metric,
     on the mixer-averaged seed means of the hybrid ratios 24:1, 12:1, 6:1, 3:1 (pure left out:
     pure cells at chance would make any hybrid look like a rise), agrees when all of:
       a. no step from 24:1 to 3:1 falls by more than RECALL_DROP (monotone up to noise);
       b. 3:1 is at least RECALL_RISE above 24:1;
       c. 3:1 is within RECALL_MARGIN of the Transformer;
       d. Spearman's rho of attention share and recall over every hybrid cell and seed has a 95%
          bootstrap interval above 0.
     Otherwise it disagrees, naming the parts that failed. It cannot tell when no positive control
     scored above CONTROL_FLOOR on the metric (the grid's Transformer, or an external control such
     as the teacher, `control.json`): a 0 is then a floor of the task or the scorer, not a result.
  3. The best standalone mixer is not the best hybrid one. On held-out bits per byte and on the
     hardest MQAR shape: the best mixer at pure against the best at 6:1 (the study's recommended
     range is 3:1 to 6:1; 3:1 shown beside). Agrees when at least 95% of the bootstrap resamples
     give two different best mixers, disagrees when at least 95% give the same one, otherwise not
     resolved. Beside it: Kendall's tau of the pure and 6:1 rankings (1: the same order), and the
     study's named recommendation, whether the best mixer at 6:1 and at 3:1 is HGRN-2 or Gated
     DeltaNet (`RECOMMENDED`), with the share of resamples where it is.
Averages over mixers use only the mixers that have every cell compared, so a partial grid reads the
claims on what it has, and says which mixers that is.

The slice gate (`slice_gate`; the medium pilot's claims.md, sizes with `reports_gate`): the ratio
slice at the medium size (Gated DeltaNet and HGRN-2 at every ratio, the Transformer) runs only if
the pilot's Transformer (seed 0, its final checkpoint: result.json) scores at least GATE_THRESHOLD
on GATE_TASK at GATE_LENGTH tokens. Below that it fails, where a positive control (control.json:
the teacher) scored above CONTROL_FLOOR on the same task and length; without one it cannot tell
(a 0 could be the scorer's). Without a finished Transformer cell it cannot tell. The grid runs a
size that `needs_gate` only when it passes.
"""
from __future__ import annotations

import numpy as np

from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.experiments.scoring import MQAR_VOCAB

QUALITY_SPAN = 0.02
RECALL_RISE = 0.05
RECALL_DROP = 0.02
RECALL_MARGIN = 0.05
CONTROL_FLOOR = 0.0
MIN_SEEDS = 2
BOOTSTRAP = 2000
CONFIDENCE = 0.95
HYBRID_RATIOS = ("24:1", "12:1", "6:1", "3:1")
RECOMMENDED = ("hgrn2", "gated_deltanet")
GATE_TASK, GATE_LENGTH, GATE_THRESHOLD = "niah_single", 1024, 0.3
GATE_RULE = (f"the Transformer's {GATE_TASK} at {GATE_LENGTH:,} tokens reaches {GATE_THRESHOLD} "
             "at the end of the pilot")
SOURCE = "Wang et al., A Systematic Analysis of Hybrid Linear Attention, arXiv:2507.06457"


# ----------------------------------------------------------------------------- reading results
def mqar_shapes(results) -> list[tuple[int, int]]:
  """The (seq_len, pairs) MQAR shapes scored in any of `results`, shortest and fewest first."""
  return sorted({(m["seq_len"], m["num_kv_pairs"]) for r in results for m in r.get("mqar", ())})


def mqar_accuracy(r, shape) -> float | None:
  """A result's MQAR accuracy at `shape` (seq_len, pairs); None where it was not scored."""
  return next((m["accuracy"] for m in r.get("mqar", ()) if (m["seq_len"], m["num_kv_pairs"]) == shape),
              None)


def value(r, metric):
  """metric: a result key, or an MQAR shape (seq_len, pairs)."""
  return mqar_accuracy(r, metric) if isinstance(metric, tuple) else r.get(metric)


def seed_values(results, metric) -> dict:
  """{(mixer, ratio): [the metric at each seed]} over the results that scored it."""
  out: dict = {}
  for r in results:
    v = value(r, metric)
    if v is not None:
      out.setdefault((r["mixer"], r["ratio"]), []).append(float(v))
  return out


def interval(values) -> tuple[float, float | None]:
  """(mean, half-width of its 95% t-interval) of one cell's seed values; None below two seeds."""
  values = np.asarray(values, float)
  if len(values) < 2:
    return float(values.mean()), None
  from scipy import stats  # a dependency of jax
  half = stats.t.ppf(0.5 + CONFIDENCE / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
  return float(values.mean()), float(half)


def _complete_mixers(cells: dict, ratios) -> list[str]:
  return [m for m in sizes_lib.MIXERS if all((m, q) in cells for q in ratios)]


def _resamples(cells: dict, rng) -> dict:
  """{cell: [BOOTSTRAP + 1] seed means}: entry 0 the plain mean, then each cell's seeds drawn with
  replacement BOOTSTRAP times."""
  return {k: np.concatenate([[np.mean(v)],
                             np.asarray(v)[rng.integers(0, len(v), (BOOTSTRAP, len(v)))].mean(axis=1)])
          for k, v in cells.items()}


def bounds(samples) -> tuple[float, float]:
  """The CONFIDENCE interval of bootstrap `samples` (their quantiles)."""
  lo, hi = np.quantile(samples, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
  return float(lo), float(hi)


def _spearman(xs, ys) -> float | None:
  """Spearman's rho (ties share their mean rank); None below three points or for a constant."""
  if len(xs) < 3 or np.ptp(ys) == 0 or np.ptp(xs) == 0:
    return None
  from scipy import stats
  return float(stats.spearmanr(xs, ys).statistic)


def fmt(x, digits=3) -> str:
  """A score for a table: 3 decimals, "-" for none."""
  return "-" if x is None else f"{x:.{digits}f}"


def _fmt_bounds(b) -> str:
  return "-" if b is None else f"[{b[0]:.3f}, {b[1]:.3f}]"


def _seed_counts(cells: dict, keys) -> str:
  counts = sorted({len(cells[k]) for k in keys})
  return "/".join(str(c) for c in counts) + (" seed" if counts == [1] else " seeds")


# ----------------------------------------------------------------------------- claim 1
def claim_quality(results) -> dict:
  cells = seed_values(results, "heldout_bits_per_byte")
  ratios = sizes_lib.RATIOS
  mixers = _complete_mixers(cells, ratios)
  out = dict(mixers=mixers, spans={}, by_ratio=None, verdict="cannot tell: no mixer has every ratio")
  if not mixers:
    return out
  keys = [(m, q) for m in mixers for q in ratios]
  samples = _resamples({k: cells[k] for k in keys}, np.random.default_rng(0))
  for m in mixers:
    v = np.stack([samples[(m, q)] for q in ratios])
    spans = (v.max(axis=0) - v.min(axis=0)) / v.mean(axis=0)
    out["spans"][m] = dict(span=float(spans[0]), bounds=bounds(spans[1:]))
  out["by_ratio"] = {q: float(np.mean([samples[(m, q)][0] for m in mixers])) for q in ratios}
  out["seeds"] = _seed_counts(cells, keys)
  wide = [m for m in mixers if out["spans"][m]["span"] > QUALITY_SPAN]
  out["verdict"] = "agrees" if not wide else (
      "disagrees: " + ", ".join(f"{sizes_lib.label(m)} spans {out['spans'][m]['span']:.1%}" for m in wide))
  return out


# ----------------------------------------------------------------------------- claim 2
def controls(results, metric, control: dict | None = None) -> dict:
  """{name: score} of the positive controls of a recall metric: the grid's Transformer (its seed
  mean) and an external control (`control.json`: e.g. the teacher) where it scored the metric."""
  out = {}
  t = seed_values(results, metric).get(sizes_lib.TRANSFORMER)
  if t:
    out["Transformer"] = float(np.mean(t))
  if control and value(control, metric) is not None:
    out[control.get("name", "control")] = float(value(control, metric))
  return out


def claim_recall(results, metric, control: dict | None = None) -> dict:
  cells = seed_values(results, metric)
  mixers = _complete_mixers(cells, HYBRID_RATIOS)
  transformer = cells.get(sizes_lib.TRANSFORMER)
  ctrl = controls(results, metric, control)
  out = dict(metric=metric, mixers=mixers, controls=ctrl, by_ratio=None, rho=None, rho_bounds=None,
             transformer=float(np.mean(transformer)) if transformer else None, failed=[])
  if mixers:
    keys = [(m, q) for m in mixers for q in HYBRID_RATIOS]
    means = {k: float(np.mean(cells[k])) for k in keys}
    out["by_ratio"] = {q: float(np.mean([means[(m, q)] for m in mixers])) for q in HYBRID_RATIOS}
    pure = [m for m in mixers if (m, "pure") in cells]
    out["pure"] = float(np.mean([np.mean(cells[(m, "pure")]) for m in pure])) if pure else None
    share = {r["ratio"]: r["attention_share"] for r in results if r["ratio"] in HYBRID_RATIOS}
    points = np.array([(share[q], v) for m, q in keys for v in cells[(m, q)]])
    out["rho"] = _spearman(points[:, 0], points[:, 1])
    if out["rho"] is not None:
      rng = np.random.default_rng(1)
      boot = [_spearman(*points[rng.integers(0, len(points), len(points))].T) for _ in range(BOOTSTRAP)]
      out["rho_bounds"] = bounds([b for b in boot if b is not None])
    out["seeds"] = _seed_counts(cells, keys)
  if not any(v > CONTROL_FLOOR for v in ctrl.values()):
    out["verdict"] = ("cannot tell: no positive control scored above "
                      f"{CONTROL_FLOOR:g}" + (f" ({', '.join(f'{k} {v:.3f}' for k, v in ctrl.items())})"
                                              if ctrl else " (none scored this metric)"))
  elif not mixers:
    out["verdict"] = "cannot tell: no mixer has every hybrid ratio"
  else:
    v = out["by_ratio"]
    steps = [v[b] - v[a] for a, b in zip(HYBRID_RATIOS, HYBRID_RATIOS[1:])]
    if min(steps) < -RECALL_DROP:
      out["failed"].append(f"falls by {-min(steps):.3f} between two ratios")
    if v["3:1"] - v["24:1"] < RECALL_RISE:
      out["failed"].append(f"3:1 is {v['3:1'] - v['24:1']:+.3f} from 24:1")
    if out["transformer"] is None or v["3:1"] < out["transformer"] - RECALL_MARGIN:
      out["failed"].append("3:1 not within the margin of the Transformer" if out["transformer"] is not None
                           else "no Transformer to compare 3:1 with")
    if out["rho_bounds"] is None or out["rho_bounds"][0] <= 0:
      out["failed"].append("rho's interval reaches 0")
    out["verdict"] = "agrees" if not out["failed"] else "disagrees: " + "; ".join(out["failed"])
  return out


# ----------------------------------------------------------------------------- claim 3
def kendall(a: list, b: list) -> float | None:
  """Kendall's tau of two rankings' scores; None below two points."""
  if len(a) < 2:
    return None
  from scipy import stats
  return float(stats.kendalltau(a, b).statistic)


def claim_best_mixer(results, metric, higher_is_better: bool) -> dict:
  cells = seed_values(results, metric)
  ratios = ("pure", "6:1", "3:1")
  mixers = _complete_mixers(cells, ratios)
  out = dict(metric=metric, mixers=mixers, best={}, tau=None, recommended={})
  if len(mixers) < 2:
    out["verdict"] = "cannot tell: fewer than two mixers have pure, 6:1 and 3:1"
    return out
  keys = [(m, q) for m in mixers for q in ratios]
  samples = _resamples({k: cells[k] for k in keys}, np.random.default_rng(2))
  sign = -1 if higher_is_better else 1
  # best[q]: the index into `mixers` of the best mixer at ratio q, in each resample
  best = {q: np.argmin(sign * np.stack([samples[(m, q)] for m in mixers]), axis=0) for q in ratios}
  for q in ratios:
    m = mixers[best[q][0]]
    out["best"][q] = (m, float(samples[(m, q)][0]), len(mixers))
  out["tau"] = kendall([samples[(m, "pure")][0] for m in mixers], [samples[(m, "6:1")][0] for m in mixers])
  differ = float(np.mean(best["pure"][1:] != best["6:1"][1:]))
  out["differ_share"] = differ
  recommended = [i for i, m in enumerate(mixers) if m in RECOMMENDED]
  for q in ("6:1", "3:1"):
    out["recommended"][q] = float(np.mean(np.isin(best[q][1:], recommended)))
  out["seeds"] = _seed_counts(cells, keys)
  if min(len(cells[k]) for k in keys) < MIN_SEEDS:
    out["verdict"] = (f"cannot tell: {out['seeds']} per cell (a verdict needs {MIN_SEEDS}); "
                      f"the point estimates {'differ' if differ else 'agree'}")
  elif differ >= CONFIDENCE:
    out["verdict"] = "agrees"
  elif differ <= 1 - CONFIDENCE:
    out["verdict"] = "disagrees"
  else:
    out["verdict"] = f"not resolved ({differ:.0%} of resamples differ)"
  return out


# ----------------------------------------------------------------------------- the slice gate
def ruler_accuracy(r, task: str, length: int) -> float | None:
  """A result's (or control's) RULER-style accuracy on `task` at `length`; None where unscored."""
  return next((row["accuracy"] for row in r.get("ruler", ())
               if row["task"] == task and row["length"] == length), None)


def slice_gate(results, control: dict | None = None) -> dict:
  """The slice gate of the module docstring: {"transformer": its GATE_TASK accuracy at
  GATE_LENGTH, "control": the positive control's, "passes", "verdict"}."""
  transformer = [r for r in results if r["mixer"] == "transformer" and r.get("seed", 0) == 0]
  value = ruler_accuracy(transformer[0], GATE_TASK, GATE_LENGTH) if transformer else None
  ctrl = ruler_accuracy(control, GATE_TASK, GATE_LENGTH) if control else None
  out = dict(transformer=value, control=ctrl, passes=False)
  scored = f"the Transformer's {GATE_TASK} at {GATE_LENGTH:,} tokens is {fmt(value)}"
  if value is None:
    out["verdict"] = (f"cannot tell: no finished Transformer cell (seed 0) scored {GATE_TASK} at "
                      f"{GATE_LENGTH:,} tokens")
  elif value >= GATE_THRESHOLD:
    out.update(passes=True, verdict=f"passes: {scored} (>= {GATE_THRESHOLD}): the ratio slice runs")
  elif ctrl is None or ctrl <= CONTROL_FLOOR:
    out["verdict"] = (f"cannot tell: {scored} (< {GATE_THRESHOLD}), and no positive control scored "
                      f"above {CONTROL_FLOOR:g} on it (control.json: {fmt(ctrl)})")
  else:
    out["verdict"] = (f"fails: {scored} (< {GATE_THRESHOLD}; the positive control "
                      f"{control.get('name', 'control')} scores {fmt(ctrl)}): the ratio slice "
                      "does not run")
  return out


def reports_gate(results) -> bool:
  """Whether any of `results` is of a size whose claims.md reports the slice gate."""
  return any(getattr(sizes_lib.SIZES.get(r.get("size")), "reports_gate", False) for r in results)


# ----------------------------------------------------------------------------- claims.md
def recall_metrics(results) -> list[tuple]:
  """(metric, name) of the recall metrics the claims read: the hardest MQAR shape, the MQAR mean,
  the RULER-style mean."""
  shapes = mqar_shapes(results)
  hardest = [(shapes[-1], f"MQAR at {shapes[-1][0]} tokens, {shapes[-1][1]} pairs")] if shapes else []
  return hardest + [("mqar_mean", "MQAR mean"), ("ruler_mean", "RULER-style mean")]


def claims_markdown(results: list[dict], control: dict | None = None) -> str:
  """claims.md: each claim, its rule, its numbers on this grid and the verdict."""
  label = sizes_lib.label
  seeds = sorted({r.get("seed", 0) for r in results})
  lines = ["# The study's claims on this grid\n",
           f"{len(results)} cells (seeds {', '.join(map(str, seeds)) or '-'}). The rules are "
           "`lineax_lm.experiments.claims`' docstring, fixed before these runs; intervals are 95% "
           f"(bootstrap, {BOOTSTRAP} resamples). The claims are those of {SOURCE}.\n"]
  if control:
    lines.append(f"Positive control: {control.get('name', 'control')} ({control.get('description', '')}).\n")
  q = claim_quality(results)
  lines += ["## 1. LM quality barely moves with the ratio\n",
            f"Rule: every mixer's held-out bits per byte spans at most {QUALITY_SPAN:.0%} of its "
            "mean across the five ratios.\n"]
  if q["by_ratio"]:
    lines += ["| mixer | span across ratios | 95% interval |", "|---|---|---|"]
    lines += [f"| {label(m)} | {s['span']:.2%} | [{s['bounds'][0]:.2%}, {s['bounds'][1]:.2%}] |"
              for m, s in q["spans"].items()]
    lines += ["", "| | " + " | ".join(q["by_ratio"]) + " |", "|---" * (len(q["by_ratio"]) + 1) + "|",
              "| held-out bits per byte, mixer mean | "
              + " | ".join(fmt(v) for v in q["by_ratio"].values()) + " |", "",
              f"Data: {len(q['mixers'])} mixer(s), {q['seeds']} per cell."]
  lines += [f"\n**Verdict: {q['verdict']}.**\n", "## 2. Recall rises with the share of attention\n",
            f"Rule: on the mixer-averaged hybrid ratios, no fall of more than {RECALL_DROP} from one "
            f"ratio to the next, 3:1 at least {RECALL_RISE} above 24:1 and within {RECALL_MARGIN} "
            "of the Transformer, and Spearman's rho (share, recall; hybrid cells, every seed) with "
            "its 95% interval above 0. A metric no positive control scores on cannot tell.\n",
            "| recall metric | " + " | ".join(HYBRID_RATIOS) + " | pure | Transformer | controls "
            "| rho [95%] | verdict |", "|---" * 10 + "|"]
  for metric, name in recall_metrics(results):
    c = claim_recall(results, metric, control)
    by = c["by_ratio"] or {}
    ctrl = ", ".join(f"{k} {v:.3f}" for k, v in c["controls"].items()) or "-"
    lines.append(f"| {name} | " + " | ".join(fmt(by.get(r)) for r in HYBRID_RATIOS)
                 + f" | {fmt(c.get('pure'))} | {fmt(c['transformer'])} | {ctrl} | {fmt(c['rho'])}"
                 + (f" {_fmt_bounds(c['rho_bounds'])}" if c["rho_bounds"] else "") + f" | {c['verdict']} |")
  if mqar_shapes(results):
    lines.append(f"\nMQAR's chance, a uniform guess among its {MQAR_VOCAB // 2} value tokens, is "
                 f"{1 / (MQAR_VOCAB // 2):.3f}: a control at or below it has not learned the lookup, "
                 f"though the rule's floor ({CONTROL_FLOOR:g}) counts it as one that scored.")
  lines += ["\n## 3. The best standalone mixer is not the best hybrid one\n",
            f"Rule: the best mixer at pure differs from the best at 6:1 in at least {CONFIDENCE:.0%} "
            f"of the bootstrap resamples (the same in {CONFIDENCE:.0%}: disagrees), with at least "
            f"{MIN_SEEDS} seeds a cell. The study recommends HGRN-2 or Gated DeltaNet at 3:1 to 6:1.\n",
            "| metric | best at pure | best at 6:1 | best at 3:1 | Kendall tau (pure, 6:1) | best "
            "at 6:1 / 3:1 recommended | verdict |", "|---" * 7 + "|"]
  hardest = mqar_shapes(results)[-1:] if mqar_shapes(results) else []
  for metric, name, higher in [("heldout_bits_per_byte", "held-out bits per byte", False)] + [
      (s, f"MQAR at {s[0]} x {s[1]}", True) for s in hardest]:
    c = claim_best_mixer(results, metric, higher)
    best = [f"{label(c['best'][q][0])} {fmt(c['best'][q][1])} (of {c['best'][q][2]})"
            if q in c["best"] else "-" for q in ("pure", "6:1", "3:1")]
    rec = " / ".join(f"{c['recommended'][q]:.0%}" for q in ("6:1", "3:1")) if c["recommended"] else "-"
    lines.append(f"| {name} | " + " | ".join(best) + f" | {fmt(c['tau'], 2)} | {rec} | {c['verdict']} |")
  if reports_gate(results):
    gate = slice_gate(results, control)
    lines += ["\n## The slice gate\n",
              f"Rule, fixed before the pilot ran: the ratio slice (Gated DeltaNet and HGRN-2 at "
              f"every ratio, the Transformer) runs only if {GATE_RULE}. Below it the gate fails "
              f"where a positive control scored above {CONTROL_FLOOR:g} on the same task and "
              "length, and cannot tell where none did.\n",
              f"Transformer: {fmt(gate['transformer'])}; positive control: {fmt(gate['control'])}.",
              f"\n**Verdict: {gate['verdict']}.**"]
  return "\n".join(lines) + "\n"
