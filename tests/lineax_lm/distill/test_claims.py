"""The linearization study's claim rules (lineax_lm.distill.claims) on made-up evaluations whose
answer is known: the study's order agrees, a swapped one disagrees, and needle zeros are read only
where the needle control scored."""
import numpy as np
import pytest

from lineax_lm.distill import claims

STUDY_ORDER = {"mlstm_dense": 0.54, "gated_deltanet": 0.50, "mlstm": 0.42, "gla": 0.41, "kda": 0.40,
               "retention": 0.31, "deltanet": 0.20, "linear_attn": 0.11}


def summaries(recovery: dict, needle: dict | None = None, batches: int = 12, noise: float = 0.01):
  """Evaluation summaries of students whose recovery on both held-out sets is `recovery` (plus
  per-batch noise), needle accuracy at 2,048 `needle` (default 0), 16 examples a task."""
  rng = np.random.default_rng(0)
  count = np.full(batches, 8 * 2048.0)
  teacher = 3.0 * count
  out = {}
  for name, rec in recovery.items():
    s = {"needle_examples": 16, "needle": {
        "teacher": {"niah_single@2048": 1.0, "niah_multikey@2048": 0.5},
        "student": {k: (needle or {}).get(name, 0.0) for k in ("niah_single@2048",
                                                                "niah_multikey@2048")}}}
    for held_out in ("teacher_samples", "text"):
      student = teacher - np.log(rec) * count + rng.normal(0, noise, batches) * count
      s[f"loss_batches_{held_out}"] = {
          "teacher": {"loss_sum": teacher.tolist(), "count": count.tolist()},
          "student": {"loss_sum": student.tolist(), "count": count.tolist()}}
      s[f"recovery_{held_out}"] = float(np.exp((teacher.sum() - student.sum()) / count.sum()))
    out[name] = s
  return out


def test_intervals_match_known_values():
  assert claims.wilson(0.5, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
  assert claims.wilson(0.0, 32) == pytest.approx((0.0, 0.1072), abs=1e-4)
  low, high = claims.newcombe(0.0, 32, 0.0, 32)
  assert low == pytest.approx(-0.1072, abs=1e-4) and high == pytest.approx(0.1072, abs=1e-4)


def test_the_studys_order_agrees_and_a_swapped_one_disagrees():
  result = claims.claim_ranking(summaries(STUDY_ORDER))
  assert result["verdict"] == "agrees"
  (point, low, high) = result["sets"]["text"]["recovery"]["gated_deltanet"]
  assert low < point < high and point == pytest.approx(0.50, abs=0.01)
  swapped = dict(STUDY_ORDER, linear_attn=0.60)  # linear attention first
  result = claims.claim_ranking(summaries(swapped))
  assert result["verdict"].startswith("disagrees")
  assert "a. the best is an xLSTM student" in result["verdict"]
  assert "c. linear attention among the last 2" in result["verdict"]


def test_close_students_are_not_resolved_and_missing_ones_cannot_tell():
  close = dict(STUDY_ORDER, gla=0.50)  # GLA level with Gated DeltaNet: within the batches' noise
  assert claims.claim_ranking(summaries(close, noise=0.05))["verdict"].startswith("not resolved")
  partial = {k: v for k, v in STUDY_ORDER.items() if k != "kda"}
  assert claims.claim_ranking(summaries(partial))["verdict"] == "cannot tell: kda not finished"


def test_needle_zeros_are_read_only_where_the_control_scored():
  zeros = summaries(STUDY_ORDER)
  control = summaries({"gated_deltanet": 0.6}, {"gated_deltanet": 0.5})["gated_deltanet"]
  assert claims.claim_needle(zeros)["verdict"].startswith("cannot tell")
  result = claims.claim_needle(zeros, control)
  assert result["verdict"].startswith("disagrees")  # 0 vs 0 of 32: the gap is below 0.2 at 95%
  assert result["control"] == (0.5, 32)
  found = summaries(STUDY_ORDER, {"gated_deltanet": 0.8})
  assert claims.claim_needle(found, control)["verdict"] == "agrees"
  some = summaries(STUDY_ORDER, {"gated_deltanet": 0.25, "linear_attn": 0.1})
  assert claims.claim_needle(some, control)["verdict"].startswith("not resolved")


def test_claims_markdown_names_rules_intervals_and_verdicts():
  text = claims.claims_markdown(summaries(STUDY_ORDER), None)
  assert "## 1. Ranking by recovery" in text and "**Verdict: agrees.**" in text
  assert "| Gated DeltaNet | 0.5" in text and "needle control: not given" in text
  assert "**Verdict: cannot tell: the needle control" in text


def test_a_needle_control_that_is_no_folder_is_refused_by_name(tmp_path):
  from lineax_lm.distill import study
  with pytest.raises(SystemExit, match="--needle_control=.*not a folder"):
    study.parse_args(["--workdir", str(tmp_path), "--needle_control", str(tmp_path / "none")])
