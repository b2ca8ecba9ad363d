"""The study's claims read off synthetic grids: each verdict follows its stated rule, intervals come
from the seeds, a recall metric no positive control scores on cannot tell, and a partial grid says
it cannot tell instead of guessing."""
import pytest

from lineax_lm.experiments import claims
from lineax_lm.experiments import sizes as sizes_lib

SHARE = {"24:1": 1 / 24, "12:1": 2 / 24, "6:1": 3 / 24, "3:1": 6 / 24, "pure": 0.0}


def grid(bpb, recall, transformer_recall=0.9, seeds=(0, 1, 2), noise=0.004):
  """Every cell at every seed: bpb(mixer, ratio) and recall(mixer, ratio) -> MQAR at 512 x 64 (the
  hardest of two shapes) and the MQAR mean, each seed off by +-noise; RULER-style mean 0."""
  results = []
  cells = [(m, q) for m in sizes_lib.MIXERS for q in sizes_lib.RATIOS] + [sizes_lib.TRANSFORMER]
  for m, q in cells:
    for s in seeds:
      d = noise * (s - 1)
      v = (transformer_recall if m == "transformer" else recall(m, q)) + d
      results.append(dict(name=sizes_lib.cell_name(m, q, s), mixer=m, ratio=q, seed=s,
                          label=sizes_lib.label(m), attention_share=SHARE.get(q, 1.0),
                          heldout_bits_per_byte=(2.5 if m == "transformer" else bpb(m, q)) + d,
                          ruler_mean=0.0, mqar_mean=(1 + v) / 2,
                          mqar=[dict(seq_len=128, num_kv_pairs=16, accuracy=1.0),
                                dict(seq_len=512, num_kv_pairs=64, accuracy=v)]))
  return results


def rising(m, q):
  return 0.2 + 2 * SHARE[q]     # 24:1 0.283 ... 3:1 0.700, pure 0.2


def test_the_studys_own_picture_agrees_on_every_claim():
  offset = {m: i / 100 for i, m in enumerate(sizes_lib.MIXERS)}  # HGRN best alone (2.200)
  # bits per byte flat in the ratio but for HGRN-2, best at 6:1 and 3:1 (2.180); recall rising
  # with the share of attention to the Transformer's
  results = grid(bpb=lambda m, q: 2.2 + offset[m] - (0.03 if m == "hgrn2" and q in ("6:1", "3:1") else 0),
                 recall=rising, transformer_recall=0.72)
  q = claims.claim_quality(results)
  assert q["verdict"] == "agrees" and q["mixers"] == list(sizes_lib.MIXERS)
  assert q["spans"]["hgrn2"]["span"] == pytest.approx(0.03 / 2.198, rel=1e-6)
  assert q["spans"]["hgrn"]["span"] == 0 and q["spans"]["hgrn"]["bounds"][1] < claims.QUALITY_SPAN
  r = claims.claim_recall(results, (512, 64))
  assert r["verdict"] == "agrees" and r["by_ratio"]["3:1"] == pytest.approx(0.7)
  assert r["rho"] > 0.9 and r["rho_bounds"][0] > 0
  assert claims.claim_recall(results, "ruler_mean")["verdict"].startswith("cannot tell: no positive control")
  best = claims.claim_best_mixer(results, "heldout_bits_per_byte", higher_is_better=False)
  assert best["best"]["pure"][0] == "hgrn" and best["best"]["6:1"][0] == "hgrn2"
  assert best["verdict"] == "agrees" and best["differ_share"] == 1.0 and best["recommended"]["6:1"] == 1.0
  assert best["tau"] == pytest.approx(13 / 15)  # one swap of 15 pairs
  md = claims.claims_markdown(results)
  assert "| MQAR at 512 tokens, 64 pairs | 0.283 | 0.367 | 0.450 | 0.700 | 0.200 | 0.720 |" in md
  assert "| held-out bits per byte | HGRN 2.200 (of 6) | HGRN-2 2.180 (of 6) |" in md
  assert md.count("**Verdict: agrees.**") == 1 and "seeds 0, 1, 2" in md


def test_recall_that_peaks_below_3_to_1_disagrees():
  peak = {"24:1": 0.6, "12:1": 0.9, "6:1": 0.85, "3:1": 0.7, "pure": 0.02}  # the conv-recall grid's shape
  results = grid(bpb=lambda m, q: 2.0, recall=lambda m, q: peak[q])
  r = claims.claim_recall(results, (512, 64))
  assert r["by_ratio"] == pytest.approx({k: v for k, v in peak.items() if k != "pure"})
  assert r["verdict"].startswith("disagrees") and "falls by 0.150" in r["verdict"]
  assert "3:1 not within the margin" in r["verdict"]


def test_pure_cells_at_chance_do_not_make_a_rise():
  # flat among the hybrids, chance when pure: the old rule (3:1 above pure, rho over every cell)
  # passed this; the hybrid ratios alone show no rise
  results = grid(bpb=lambda m, q: 2.0, recall=lambda m, q: 0.02 if q == "pure" else 0.9,
                 transformer_recall=0.9)
  r = claims.claim_recall(results, (512, 64))
  assert r["verdict"].startswith("disagrees") and "3:1 is +0.000 from 24:1" in r["verdict"]
  assert "rho's interval reaches 0" in r["verdict"]


def test_a_zero_no_control_scores_on_cannot_tell_and_an_external_control_can():
  results = grid(bpb=lambda m, q: 2.0, recall=rising, transformer_recall=0.0)
  for r in results:
    if r["mixer"] == "transformer":
      r["ruler_mean"] = 0.0
  assert claims.claim_recall(results, "ruler_mean")["verdict"] == (
      "cannot tell: no positive control scored above 0 (Transformer 0.000)")
  teacher = dict(name="smollm2", description="the teacher", ruler_mean=0.6)
  r = claims.claim_recall(results, "ruler_mean", teacher)
  assert r["controls"] == {"Transformer": 0.0, "smollm2": 0.6} and r["verdict"].startswith("disagrees")
  assert "smollm2 0.600" in claims.claims_markdown(results, teacher)


def test_quality_moving_with_one_mixer_disagrees_naming_it():
  results = grid(bpb=lambda m, q: 2.0 + (SHARE[q] if m == "gla" else 0), recall=rising)
  q = claims.claim_quality(results)
  assert q["verdict"] == "disagrees: GLA spans 11.9%"


def test_one_seed_gives_point_estimates_but_no_verdict_on_the_best_mixer():
  results = grid(bpb=lambda m, q: 2.0 + (0 if m == "gla" else 0.1), recall=rising, seeds=(0,))
  best = claims.claim_best_mixer(results, "heldout_bits_per_byte", False)
  assert best["verdict"] == ("cannot tell: 1 seed per cell (a verdict needs 2); the point "
                             "estimates agree")
  assert best["tau"] == pytest.approx(1.0)
  results = grid(bpb=lambda m, q: 2.0 + (0 if m == "gla" else 0.1), recall=rising)
  assert claims.claim_best_mixer(results, "heldout_bits_per_byte", False)["verdict"] == "disagrees"


def test_close_mixers_are_not_resolved():
  # GLA and HGRN-2 1e-3 apart at 6:1 with seeds 4e-3 apart: the bootstrap cannot order them
  bpb = lambda m, q: 2.0 + {"gla": 0.0, "hgrn2": 0.001}.get(m, 0.1) if q == "6:1" else 2.0 + (m != "gla") * 0.1
  results = grid(bpb=bpb, recall=rising, noise=0.01)
  for r in results:  # the seeds of one mixer move apart, not together
    if r["mixer"] == "hgrn2" and r["ratio"] == "6:1":
      r["heldout_bits_per_byte"] += 0.02 * (r["seed"] == 2) - 0.01
  verdict = claims.claim_best_mixer(results, "heldout_bits_per_byte", False)["verdict"]
  assert verdict.startswith("not resolved")


def test_a_partial_grid_cannot_tell():
  results = [r for r in grid(bpb=lambda m, q: 2.0, recall=lambda m, q: 0.5)
             if r["mixer"] in ("gated_deltanet", "transformer") and r["ratio"] in ("pure", "3:1", "transformer")]
  assert claims.claim_quality(results)["verdict"].startswith("cannot tell")
  assert claims.claim_best_mixer(results, "heldout_bits_per_byte", False)["verdict"].startswith("cannot tell")
  assert claims.claim_recall(results, (512, 64))["verdict"] == "cannot tell: no mixer has every hybrid ratio"
  assert "cannot tell" in claims.claims_markdown([])


def pilot(needle_at_1k=None, size="medium"):
  """The medium pilot's three cells; the Transformer's niah_single at 1,024 tokens `needle_at_1k`
  (None: the Transformer has not finished)."""
  cells = [("gated_deltanet", "3:1"), ("gated_deltanet", "pure")]
  cells += [sizes_lib.TRANSFORMER] if needle_at_1k is not None else []
  return [dict(name=sizes_lib.cell_name(m, q), mixer=m, ratio=q, seed=0, size=size,
               label=sizes_lib.label(m), attention_share=SHARE.get(q, 1.0),
               ruler=[dict(task="niah_single", length=L, accuracy=needle_at_1k if m == "transformer"
                           else 0.0) for L in (512, 1024, 2048)]) for m, q in cells]


def test_the_slice_gate_reads_the_transformers_single_needle_at_1k():
  teacher = dict(name="smollm2", description="the teacher",
                 ruler=[dict(task="niah_single", length=1024, accuracy=1.0)])
  passed = claims.slice_gate(pilot(0.3), teacher)
  assert passed["passes"] and passed["verdict"] == ("passes: the Transformer's niah_single at "
                                                    "1,024 tokens is 0.300 (>= 0.3): the ratio "
                                                    "slice runs")
  failed = claims.slice_gate(pilot(0.28), teacher)
  assert not failed["passes"] and failed["verdict"].startswith("fails: ")
  assert "smollm2 scores 1.000" in failed["verdict"]
  # below the threshold with no control that scored: a 0 could be the scorer's
  for control in (None, dict(teacher, ruler=[dict(task="niah_single", length=1024, accuracy=0.0)])):
    verdict = claims.slice_gate(pilot(0.0), control)
    assert not verdict["passes"] and verdict["verdict"].startswith("cannot tell: ")
  assert claims.slice_gate(pilot(None), teacher)["verdict"] == (
      "cannot tell: no finished Transformer cell (seed 0) scored niah_single at 1,024 tokens")


def test_claims_md_reports_the_gate_for_the_medium_sizes_only():
  md = claims.claims_markdown(pilot(0.5))
  assert "## The slice gate" in md and "**Verdict: passes: " in md
  assert "## The slice gate" in claims.claims_markdown(pilot(None, size="medium_slice"))
  assert "## The slice gate" not in claims.claims_markdown(pilot(0.5, size="small"))
