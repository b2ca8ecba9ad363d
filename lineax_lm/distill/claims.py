"""The linearization study's claims read off its students' evaluations (claims.md beside study.md),
each by a rule fixed here before the runs it judges, with the data it read and a 95% interval.

The claims are two sentences of the study's abstract (Haller, Golde and Akbik, arXiv:2504.14366;
docs/linearization_study.md) that one teacher size and one budget can test. One seed a student,
so the intervals are those of the evaluation sample, not of training: every model is scored on
the same held-out batches (`Distillation.heldout_loss`), and a paired bootstrap over those batches
(`BOOTSTRAP` resamples, a fixed generator) gives each recovery (teacher perplexity / student
perplexity) and each rank correlation its interval; needle accuracies are proportions of
`needle_examples` examples a task and length, with Wilson intervals (a difference of two:
Newcombe's).

  1. "Performance gaps are established early and persist." Kendall's tau between the students'
     recovery on held-out teacher samples at the start of the end-to-end stage (after the layer
     and block alignment) and at its end (the maturity curve's first and last points). Agrees
     when its 95% interval lies above `TAU_PERSIST`, disagrees when it lies below, otherwise not
     resolved. Cannot tell with fewer than `MIN_STUDENTS` students on the curve.
  2. "Only gated delta-rule formulations maintain the precision necessary for long-context
     retrieval, whereas additive models suffer from irreversible state saturation." On the
     needle tasks at `NEEDLE_LENGTH` tokens, pooled over the tasks: the best gated delta-rule
     student (`GATED_DELTA`) minus the best additive one (`ADDITIVE`; DeltaNet, a delta rule
     without a gate, is in neither). Agrees when the difference's 95% interval lies above 0;
     disagrees when it lies below `NEEDLE_GAP` (no lead worth the name can be there); otherwise
     not resolved. It cannot tell unless the needle control, a student of the same budget that
     must find the needle (the Gated DeltaNet 3:1 hybrid student: `--needle_control`), scored
     above 0 there: without it a 0 is the budget's, not the mixers'. The teacher is shown beside.
"""
from __future__ import annotations

import math

import numpy as np

from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.experiments.claims import bounds, kendall

GATED_DELTA = ("gated_deltanet", "kda")
ADDITIVE = ("mlstm", "mlstm_dense", "gla", "retention", "linear_attn")
MIN_STUDENTS = 5
TAU_PERSIST = 0.5
NEEDLE_LENGTH = 2048
NEEDLE_GAP = 0.2
Z95 = 1.959964
BOOTSTRAP = 2000
# The study's students by name (the hybrid study's labels where the mixer is one of its own).
LABELS = {"mlstm": "xLSTM (block-diagonal)", "mlstm_dense": "xLSTM (dense)",
          **{m: sizes_lib.label(m) for m in ("gla", "gated_deltanet", "deltanet", "retention")},
          "kda": "KDA", "linear_attn": "linear attention"}
CURVE_SET = "loss_batches_teacher_samples"


# ----------------------------------------------------------------------------- intervals
def wilson(p: float, n: int) -> tuple[float, float]:
  """The 95% Wilson score interval of a proportion `p` of `n` trials."""
  if n <= 0:
    return (0.0, 1.0)
  z2 = Z95 * Z95
  centre = (p + z2 / (2 * n)) / (1 + z2 / n)
  half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
  return (max(0.0, centre - half), min(1.0, centre + half))


def newcombe(p1: float, n1: int, p2: float, n2: int) -> tuple[float, float]:
  """The 95% interval of p1 - p2 from the two Wilson intervals (Newcombe's method 10)."""
  l1, u1 = wilson(p1, n1)
  l2, u2 = wilson(p2, n2)
  d = p1 - p2
  return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
          d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def recoveries(losses: dict[str, dict], seed: int = 0) -> tuple[dict, np.ndarray]:
  """({name: point recovery}, [names, BOOTSTRAP] resampled recoveries) of models whose per-batch
  losses `losses[name]` = {"teacher": {"loss_sum", "count"}, "student": {...}} cover the same
  batches; every model is resampled on the same batches (paired)."""
  first = next(iter(losses.values()))
  count = np.asarray(first["teacher"]["count"])
  idx = np.random.default_rng(seed).integers(0, len(count), size=(BOOTSTRAP, len(count)))
  points, draws = {}, []
  for name, pair in losses.items():
    teacher, student = (np.asarray(pair[w]["loss_sum"]) for w in ("teacher", "student"))
    if student.shape != count.shape or teacher.shape != count.shape:
      raise ValueError(f"{name}: {len(student)} held-out batches, others {len(count)}: the "
                       "models were scored on different data")
    points[name] = float(np.exp((teacher.sum() - student.sum()) / count.sum()))
    draws.append(np.exp((teacher[idx].sum(1) - student[idx].sum(1)) / count[idx].sum(1)))
  return points, np.stack(draws)


def kendall_columns(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Kendall's tau-b (scipy's `kendalltau`, as `kendall`) of every column pair of `a`, `b`
  ([items, resamples]) at once: a bootstrap's thousands of taus without a loop."""
  i, j = np.triu_indices(a.shape[0], k=1)
  da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
  with np.errstate(invalid="ignore", divide="ignore"):
    return (da * db).sum(0) / np.sqrt((da != 0).sum(0) * (db != 0).sum(0))


# ----------------------------------------------------------------------------- the claims
def claim_persistence(summaries: dict) -> dict:
  """Claim 1: {"students", "start", "end" ({name: recovery}), "tokens" (start, end), "tau",
  "tau_bounds", "verdict"}."""
  curves = {n: s.get("curve", []) for n, s in summaries.items() if n in LABELS}
  curves = {n: c for n, c in curves.items()
            if len(c) >= 2 and CURVE_SET in c[0] and CURVE_SET in c[-1]}
  out = dict(students=sorted(curves), start=None, end=None, tokens=None, tau=None,
             tau_bounds=None, verdict=None)
  if len(curves) < MIN_STUDENTS:
    out["verdict"] = (f"cannot tell: {len(curves)} students with a scored maturity curve (the "
                      f"rule needs {MIN_STUDENTS})")
    return out
  start, start_draws = recoveries({n: c[0][CURVE_SET] for n, c in curves.items()})
  end, end_draws = recoveries({n: c[-1][CURVE_SET] for n, c in curves.items()})
  names = list(curves)
  out.update(start=start, end=end, tokens=(curves[names[0]][0]["tokens"],
                                           curves[names[0]][-1]["tokens"]))
  out["tau"] = kendall([start[n] for n in names], [end[n] for n in names])
  taus = kendall_columns(start_draws, end_draws)
  low, high = out["tau_bounds"] = bounds(taus[np.isfinite(taus)])
  if low > TAU_PERSIST:
    out["verdict"] = "agrees"
  elif high < TAU_PERSIST:
    out["verdict"] = "disagrees: the ranking at the end is not the one at the start"
  else:
    out["verdict"] = f"not resolved: the interval reaches {TAU_PERSIST}"
  return out


def needle_at(summary: dict, who: str, length: int = NEEDLE_LENGTH) -> tuple[float, int] | None:
  """(accuracy pooled over the needle tasks at `length`, examples) of `who` ("teacher" or
  "student") in an evaluation summary; None where it has no needle at that length."""
  needle = summary.get("needle", {}).get(who, {})
  scores = [v for k, v in needle.items() if k.endswith(f"@{length}") and v is not None]
  if not scores:
    return None
  n = int(summary.get("needle_examples", 0))
  return (float(np.mean(scores)), n * len(scores))


def claim_retrieval(summaries: dict, control: dict | None = None) -> dict:
  """Claim 2: {"scores": {name: (accuracy, examples)}, "best": (gated delta-rule, additive),
  "gap": (difference, low, high), "control", "teacher", "verdict"}."""
  scores = {n: needle_at(s, "student") for n, s in summaries.items() if n in LABELS}
  anyone = next(iter(summaries.values()))
  out = dict(scores=scores, best=None, gap=None, teacher=needle_at(anyone, "teacher"),
             control=needle_at(control, "student") if control else None, verdict=None)
  groups = [[n for n in group if scores.get(n)] for group in (GATED_DELTA, ADDITIVE)]
  if not all(groups):
    out["verdict"] = (f"cannot tell: no needle at {NEEDLE_LENGTH:,} for a gated delta-rule and an "
                      "additive student")
    return out
  delta, additive = (max(group, key=lambda n: scores[n][0]) for group in groups)
  (p1, n1), (p2, n2) = scores[delta], scores[additive]
  out["best"], out["gap"] = (delta, additive), (p1 - p2,) + newcombe(p1, n1, p2, n2)
  if out["control"] is None or out["control"][0] <= 0:
    shown = "not given" if out["control"] is None else f"{out['control'][0]:.3f}"
    out["verdict"] = (f"cannot tell: the needle control (a hybrid student of the same budget) "
                      f"did not score above 0 at {NEEDLE_LENGTH:,} ({shown})")
  elif out["gap"][1] > 0:
    out["verdict"] = "agrees"
  elif out["gap"][2] < NEEDLE_GAP:
    out["verdict"] = (f"disagrees: {LABELS[delta]}'s lead over {LABELS[additive]} is below "
                      f"{NEEDLE_GAP} at 95%")
  else:
    out["verdict"] = "not resolved: the interval reaches 0"
  return out


# ----------------------------------------------------------------------------- claims.md
def _iv(point, low, high) -> str:
  return f"{point:.3f} [{low:.3f}, {high:.3f}]"


def claims_markdown(summaries: dict, control: dict | None = None, control_name: str = "") -> str:
  """claims.md for the study's `summaries` (study.json's) and the needle control's summary."""
  students = len([n for n in summaries if n in LABELS])
  lines = ["# The linearization study's claims\n",
           f"{students} student{'s' * (students != 1)}, one seed each. The rules are "
           "`lineax_lm.distill.claims`' docstring, fixed before the runs they judge; intervals are "
           f"95% (a paired bootstrap over the held-out batches, {BOOTSTRAP} resamples; Wilson and "
           "Newcombe intervals for needle accuracies): they measure the evaluation sample, not "
           "training. The claims are sentences of the study's abstract (arXiv:2504.14366).\n"]
  keep = claim_persistence(summaries)
  lines.append('## 1. "Performance gaps are established early and persist"\n')
  lines.append("Rule: Kendall's tau between the students' recovery on held-out teacher samples "
               "at the end-to-end stage's start and at its end, with its 95% interval above "
               f"{TAU_PERSIST} (below: disagrees).\n")
  if keep["tau"] is not None:
    t0, t1 = keep["tokens"]
    lines += [f"| student | recovery at {t0 / 1e6:.1f}M tokens | at {t1 / 1e6:.1f}M tokens |",
              "|---|---|---|"]
    lines += [f"| {LABELS[n]} | {keep['start'][n]:.3f} | {keep['end'][n]:.3f} |"
              for n in sorted(keep["end"], key=lambda n: -keep["end"][n])]
    lines.append(f"\nKendall's tau {_iv(keep['tau'], *keep['tau_bounds'])}.\n")
  lines.append(f"**Verdict: {keep['verdict']}.**\n")
  needle = claim_retrieval(summaries, control)
  lines.append('## 2. "Only gated delta-rule formulations maintain ... long-context retrieval"\n')
  lines.append(f"Rule: at {NEEDLE_LENGTH:,} tokens (the needle tasks pooled), the best gated "
               f"delta-rule student ({', '.join(LABELS[n] for n in GATED_DELTA)}) minus the best "
               f"additive one ({', '.join(LABELS[n] for n in ADDITIVE)}), its 95% interval above "
               f"0; below {NEEDLE_GAP}: disagrees; read only where the needle control scored "
               "above 0.\n")
  lines += ["| model | accuracy [95%] | examples |", "|---|---|---|"]
  rows = [("teacher", needle["teacher"])]
  rows.append((f"needle control: {control_name or 'not given'}", needle["control"]))
  rows += [(LABELS[n], v) for n, v in needle["scores"].items()]
  for name, v in rows:
    lines.append(f"| {name} | {_iv(v[0], *wilson(*v)) if v else '-'} | {v[1] if v else '-'} |")
  if needle["gap"]:
    delta, additive = needle["best"]
    lines.append(f"\n{LABELS[delta]} minus {LABELS[additive]}: {_iv(*needle['gap'])}.")
  lines.append(f"\n**Verdict: {needle['verdict']}.**\n")
  return "\n".join(lines)
