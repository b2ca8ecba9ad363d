"""The linearization study's claim rules (lineax_lm.distill.claims) on made-up evaluations whose
answer is known: a ranking that holds from start to end agrees and a reversed one disagrees, and
needle zeros are read only where the needle control scored."""
import numpy as np
import pytest

from lineax_lm.distill import claims

END = {"mlstm_dense": 0.54, "gated_deltanet": 0.50, "mlstm": 0.42, "gla": 0.41, "kda": 0.40,
       "retention": 0.31, "deltanet": 0.20, "linear_attn": 0.11}


def losses(rec: float, rng, batches: int = 12, noise: float = 0.01) -> dict:
  """Per-batch held-out losses of a teacher and a student whose recovery is about `rec`."""
  count = np.full(batches, 8 * 2048.0)
  teacher = 3.0 * count
  student = teacher - np.log(rec) * count + rng.normal(0, noise, batches) * count
  return {"teacher": {"loss_sum": teacher.tolist(), "count": count.tolist()},
          "student": {"loss_sum": student.tolist(), "count": count.tolist()}}


def summaries(end: dict, start: dict | None = None, needle: dict | None = None,
              noise: float = 0.01) -> dict:
  """Evaluation summaries of students whose maturity curve goes from recovery `start` (default
  half of `end`) to `end`, needle accuracy at 2,048 `needle` (default 0), 16 examples a task."""
  rng = np.random.default_rng(0)
  out = {}
  for name, rec in end.items():
    first = (start or {}).get(name, rec / 2)
    out[name] = {
        "needle_examples": 16,
        "needle": {"teacher": {"niah_single@2048": 1.0, "niah_multikey@2048": 0.5},
                   "student": {k: (needle or {}).get(name, 0.0)
                               for k in ("niah_single@2048", "niah_multikey@2048")}},
        "curve": [{"tokens": 8e6, "loss_batches_teacher_samples": losses(first, rng, noise=noise)},
                  {"tokens": 2e7, "loss_batches_teacher_samples": losses(rec, rng, noise=noise)}]}
  return out


def test_intervals_match_known_values():
  assert claims.wilson(0.5, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
  assert claims.wilson(0.0, 32) == pytest.approx((0.0, 0.1072), abs=1e-4)
  low, high = claims.newcombe(0.0, 32, 0.0, 32)
  assert low == pytest.approx(-0.1072, abs=1e-4) and high == pytest.approx(0.1072, abs=1e-4)


def test_kendall_columns_is_scipys_tau_b_per_column():
  rng = np.random.default_rng(1)
  a, b = rng.normal(size=(8, 50)), rng.normal(size=(8, 50))
  b[:, :10] = a[:, :10]  # perfectly kept rankings among them
  a[:2, 20] = 0.5  # a tie
  expected = [claims.kendall(a[:, k], b[:, k]) for k in range(50)]
  np.testing.assert_allclose(claims.kendall_columns(a, b), expected, rtol=1e-12)


def test_a_ranking_kept_from_start_to_end_agrees_and_a_reversed_one_disagrees():
  result = claims.claim_persistence(summaries(END))
  assert result["verdict"] == "agrees" and result["tau"] == pytest.approx(1.0)
  assert result["end"]["gated_deltanet"] == pytest.approx(0.50, abs=0.01)
  assert result["tokens"] == (8e6, 2e7)
  reversed_start = dict(zip(END, sorted(END.values())))  # the best at the end was the worst
  result = claims.claim_persistence(summaries(END, reversed_start))
  assert result["verdict"].startswith("disagrees") and result["tau"] < 0


def test_rankings_inside_the_batches_noise_are_redrawn_or_not_resolved():
  level = {n: 0.4 + 0.001 * i for i, n in enumerate(END)}  # gaps far inside the noise: redrawn
  assert claims.claim_persistence(summaries(level, level, noise=0.05))["verdict"].startswith(
      "disagrees")
  close = {n: 0.4 + 0.002 * i for i, n in enumerate(END)}  # gaps about the noise
  assert claims.claim_persistence(summaries(close, close, noise=0.02))["verdict"].startswith(
      "not resolved")


def test_fewer_students_than_the_rule_needs_cannot_tell():
  few = {k: END[k] for k in list(END)[:4]}
  assert claims.claim_persistence(summaries(few))["verdict"].startswith("cannot tell: 4 students")


def test_needle_zeros_are_read_only_where_the_control_scored():
  zeros = summaries(END)
  control = summaries({"gated_deltanet": 0.6}, needle={"gated_deltanet": 0.5})["gated_deltanet"]
  assert claims.claim_retrieval(zeros)["verdict"].startswith("cannot tell")
  result = claims.claim_retrieval(zeros, control)
  assert result["verdict"].startswith("disagrees")  # 0 vs 0 of 32: the lead is below 0.2 at 95%
  assert result["control"] == (0.5, 32)
  found = summaries(END, needle={"kda": 0.8, "gla": 0.1})
  result = claims.claim_retrieval(found, control)
  assert result["verdict"] == "agrees" and result["best"] == ("kda", "gla")
  some = summaries(END, needle={"gated_deltanet": 0.25, "linear_attn": 0.1})
  assert claims.claim_retrieval(some, control)["verdict"].startswith("not resolved")


def test_claims_markdown_names_rules_intervals_and_verdicts():
  text = claims.claims_markdown(summaries(END), None)
  assert '## 1. "Performance gaps are established early and persist"' in text
  assert "**Verdict: agrees.**" in text and "| Gated DeltaNet | 0.2" in text
  assert "needle control: not given" in text
  assert "**Verdict: cannot tell: the needle control" in text


def test_a_needle_control_that_is_no_folder_is_refused_by_name(tmp_path):
  from lineax_lm.distill import study
  with pytest.raises(SystemExit, match="--needle_control=.*not a folder"):
    study.parse_args(["--workdir", str(tmp_path), "--needle_control", str(tmp_path / "none")])
