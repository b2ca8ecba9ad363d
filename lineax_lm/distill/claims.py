"""The linearization study's claims read off its students' evaluations (claims.md beside study.md),
each by a rule fixed here before the runs it judges, with the data it read and a 95% interval.

The claims are the study's (docs/linearization_study.md): SmolLM2 distilled into linear students.
One seed a student, so the intervals are those of the evaluation sample, not of training: every
model is scored on the same held-out batches (`Distillation.heldout_loss`), and a paired
bootstrap over those batches (`BOOTSTRAP` resamples, a fixed generator) gives each recovery
(teacher perplexity / student perplexity) its interval and each ordering the share of resamples
in which it holds; needle accuracies are proportions of `needle_examples` examples a task and
length, with Wilson intervals (a difference of two: Newcombe's).

  1. Ranking by recovery. The study: an xLSTM student leads at the smaller sizes, Gated DeltaNet
     (gated, delta rule) is the best of the others, linear attention trails. Per held-out set
     (teacher samples, real text), the three parts:
       a. the best student is an xLSTM one (`XLSTM`);
       b. Gated DeltaNet is the best of the students that are not;
       c. linear attention is among the last `TRAILING` students.
     Agrees when every part holds in at least `AGREE` of the resamples on every set; disagrees
     when a part holds in at most 1 - `AGREE` of them on some set (naming it); otherwise not
     resolved. Cannot tell without all of `RANKED` finished.
  2. The needle at 2k: Gated DeltaNet keeps most of it (81.8% in the study) where linear
     attention and RetNet fall to about 0. On the needle tasks at `NEEDLE_LENGTH` tokens, pooled
     over the tasks: agrees when Gated DeltaNet's accuracy minus each of linear attention's and
     RetNet's has a 95% interval above 0; disagrees when either interval lies below
     `NEEDLE_GAP` (no gap the size of the study's can be there); otherwise not resolved. It
     cannot tell unless the needle control, a student of the same budget that must find the
     needle (the Gated DeltaNet 3:1 hybrid student: `--needle_control`), scored above 0 there:
     without it a 0 is the budget's, not the mixers'. The teacher is shown beside it.
"""
from __future__ import annotations

import math

import numpy as np

XLSTM = ("mlstm", "mlstm_dense")
RANKED = XLSTM + ("gla", "gated_deltanet", "deltanet", "retention", "kda", "linear_attn")
TRAILING = 2
AGREE = 0.95
NEEDLE_LENGTH = 2048
NEEDLE_GAP = 0.2
Z95 = 1.959964
BOOTSTRAP = 2000
LABELS = {"mlstm": "xLSTM (block-diagonal)", "mlstm_dense": "xLSTM (dense)", "gla": "GLA",
          "gated_deltanet": "Gated DeltaNet", "deltanet": "DeltaNet", "retention": "RetNet",
          "kda": "KDA", "linear_attn": "linear attention"}


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


def recovery_resamples(summaries: dict, held_out: str, seed: int = 0) -> dict[str, np.ndarray]:
  """{student: BOOTSTRAP recoveries on `held_out`}, every student on the same resampled batches
  (paired); the teacher's losses come with each summary (`loss_batches_<set>`)."""
  key = f"loss_batches_{held_out}"
  first = next(iter(summaries.values()))[key]
  teacher = np.asarray(first["teacher"]["loss_sum"])
  count = np.asarray(first["teacher"]["count"])
  idx = np.random.default_rng(seed).integers(0, len(count), size=(BOOTSTRAP, len(count)))
  tokens = count[idx].sum(1)
  out = {}
  for name, s in summaries.items():
    student = np.asarray(s[key]["student"]["loss_sum"])
    if student.shape != teacher.shape:
      raise ValueError(f"{name}: {len(student)} held-out batches of {held_out!r}, the teacher's "
                       f"{len(teacher)}: the students were scored on different data")
    out[name] = np.exp((teacher[idx].sum(1) - student[idx].sum(1)) / tokens)
  return out


# ----------------------------------------------------------------------------- the claims
def claim_ranking(summaries: dict) -> dict:
  """Claim 1 on every held-out set the summaries share: {"sets": {set: {"recovery": {student:
  (point, low, high)}, "parts": {part: share of resamples}}}, "verdict"}."""
  missing = [s for s in RANKED if s not in summaries]
  out = dict(sets={}, verdict=None)
  if missing:
    out["verdict"] = f"cannot tell: {', '.join(missing)} not finished"
    return out
  ranked = {s: summaries[s] for s in summaries if s in LABELS}
  sets = [k[len("loss_batches_"):] for k in summaries[RANKED[0]] if k.startswith("loss_batches_")]
  if not sets:
    out["verdict"] = "cannot tell: no per-batch held-out losses (evaluated before they were kept)"
    return out
  failed, unresolved = [], []
  for held_out in sets:
    draws = recovery_resamples(ranked, held_out)
    names = list(draws)
    stack = np.stack([draws[n] for n in names])             # [students, resamples]
    best = np.array(names)[stack.argmax(0)]
    others = [n for n in names if n not in XLSTM]
    best_other = np.array(others)[np.stack([draws[n] for n in others]).argmax(0)]
    rank_la = (stack > draws["linear_attn"][None]).sum(0)   # students above linear attention
    parts = {
        "a. the best is an xLSTM student": np.isin(best, XLSTM).mean(),
        "b. Gated DeltaNet is the best of the rest": (best_other == "gated_deltanet").mean(),
        f"c. linear attention among the last {TRAILING}": (rank_la >= len(names) - TRAILING).mean()}
    parts = {p: float(v) for p, v in parts.items()}
    point = {n: summaries[n][f"recovery_{held_out}"] for n in names}
    batches = summaries[RANKED[0]][f"loss_batches_{held_out}"]["teacher"]["count"]
    out["sets"][held_out] = dict(
        recovery={n: (point[n], float(np.percentile(draws[n], 2.5)),
                      float(np.percentile(draws[n], 97.5))) for n in names},
        parts=parts, batches=len(batches))
    failed += [f"{p} ({held_out}: {v:.0%} of resamples)" for p, v in parts.items()
               if v <= 1 - AGREE]
    unresolved += [f"{p} ({held_out}: {v:.0%})" for p, v in parts.items()
                   if 1 - AGREE < v < AGREE]
  if failed:
    out["verdict"] = "disagrees: " + "; ".join(failed)
  elif unresolved:
    out["verdict"] = "not resolved: " + "; ".join(unresolved)
  else:
    out["verdict"] = "agrees"
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


def claim_needle(summaries: dict, control: dict | None = None) -> dict:
  """Claim 2: {"scores": {name: (accuracy, examples)}, "gaps": {rival: (difference, low, high)},
  "control", "teacher", "verdict"}."""
  scores = {n: needle_at(s, "student") for n, s in summaries.items() if n in LABELS}
  anyone = next(iter(summaries.values()))
  out = dict(scores=scores, gaps={}, teacher=needle_at(anyone, "teacher"),
             control=needle_at(control, "student") if control else None, verdict=None)
  missing = [s for s in ("gated_deltanet", "linear_attn", "retention") if scores.get(s) is None]
  if missing:
    out["verdict"] = f"cannot tell: no needle at {NEEDLE_LENGTH} for {', '.join(missing)}"
    return out
  for rival in ("linear_attn", "retention"):
    (p1, n1), (p2, n2) = scores["gated_deltanet"], scores[rival]
    out["gaps"][rival] = (p1 - p2,) + newcombe(p1, n1, p2, n2)
  if out["control"] is None or out["control"][0] <= 0:
    shown = "not given" if out["control"] is None else f"{out['control'][0]:.3f}"
    out["verdict"] = (f"cannot tell: the needle control (a hybrid student of the same budget) "
                      f"did not score above 0 at {NEEDLE_LENGTH} ({shown})")
  elif all(g[1] > 0 for g in out["gaps"].values()):
    out["verdict"] = "agrees"
  elif any(g[2] < NEEDLE_GAP for g in out["gaps"].values()):
    low = [LABELS[r] for r, g in out["gaps"].items() if g[2] < NEEDLE_GAP]
    out["verdict"] = (f"disagrees: Gated DeltaNet's lead over {', '.join(low)} is below "
                      f"{NEEDLE_GAP} at 95%")
  else:
    out["verdict"] = "not resolved: the intervals reach 0"
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
           "training.\n"]
  rank = claim_ranking(summaries)
  lines.append("## 1. Ranking by recovery\n")
  lines.append("Rule: on every held-out set, the best student is an xLSTM one, Gated DeltaNet is "
               f"the best of the rest and linear attention is among the last {TRAILING}, each in "
               f"at least {AGREE:.0%} of the resamples.\n")
  for held_out, r in rank["sets"].items():
    lines += [f"Held-out {held_out.replace('_', ' ')} ({r['batches']} batches): recovery "
              "(teacher perplexity / student perplexity)\n", "| student | recovery [95%] |",
              "|---|---|"]
    for n, v in sorted(r["recovery"].items(), key=lambda kv: -kv[1][0]):
      lines.append(f"| {LABELS[n]} | {_iv(*v)} |")
    lines += ["", "| part | share of resamples |", "|---|---|"]
    lines += [f"| {p} | {v:.1%} |" for p, v in r["parts"].items()] + [""]
  lines.append(f"**Verdict: {rank['verdict']}.**\n")
  needle = claim_needle(summaries, control)
  lines.append(f"## 2. The needle at {NEEDLE_LENGTH:,} tokens\n")
  lines.append("Rule: Gated DeltaNet's needle accuracy (the needle tasks pooled) minus linear "
               "attention's and RetNet's, each with its 95% interval above 0; below "
               f"{NEEDLE_GAP} at 95%: disagrees; read only where the needle control scored above "
               "0.\n")
  lines += ["| model | accuracy [95%] | examples |", "|---|---|---|"]
  rows = [("teacher", needle["teacher"])]
  rows.append((f"needle control: {control_name or 'not given'}", needle["control"]))
  rows += [(LABELS[n], v) for n, v in needle["scores"].items()]
  for name, v in rows:
    lines.append(f"| {name} | {_iv(v[0], *wilson(*v)) if v else '-'} | {v[1] if v else '-'} |")
  if needle["gaps"]:
    lines += ["", "| Gated DeltaNet minus | difference [95%] |", "|---|---|"]
    lines += [f"| {LABELS[r]} | {_iv(*g)} |" for r, g in needle["gaps"].items()]
  lines.append(f"\n**Verdict: {needle['verdict']}.**\n")
  return "\n".join(lines)
