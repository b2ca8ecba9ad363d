"""The study's claims read off synthetic grids: each verdict follows its stated rule, and a partial
grid says it cannot tell instead of guessing."""
import pytest

from lineax_lm.experiments import claims
from lineax_lm.experiments import sizes as sizes_lib

SHARE = {"24:1": 1 / 24, "12:1": 2 / 24, "6:1": 3 / 24, "3:1": 6 / 24, "pure": 0.0}


def grid(bpb, recall, transformer_recall=0.9):
  """Every cell: bpb(mixer, ratio) and recall(mixer, ratio) -> MQAR at 512 x 64 (the hardest of two
  shapes) and the MQAR mean; RULER-style mean 0 everywhere."""
  results = []
  for m in sizes_lib.MIXERS:
    for q in sizes_lib.RATIOS:
      v = recall(m, q)
      results.append(dict(name=f"{m}_{q}", mixer=m, ratio=q, label=sizes_lib.label(m),
                          attention_share=SHARE[q], heldout_bits_per_byte=bpb(m, q), ruler_mean=0.0,
                          mqar_mean=(1 + v) / 2, mqar=[dict(seq_len=128, num_kv_pairs=16, accuracy=1.0),
                                                       dict(seq_len=512, num_kv_pairs=64, accuracy=v)]))
  results.append(dict(name="transformer", mixer="transformer", ratio="transformer", label="Transformer",
                      attention_share=1.0, heldout_bits_per_byte=2.5, ruler_mean=0.0,
                      mqar_mean=(1 + transformer_recall) / 2,
                      mqar=[dict(seq_len=128, num_kv_pairs=16, accuracy=1.0),
                            dict(seq_len=512, num_kv_pairs=64, accuracy=transformer_recall)]))
  return results


def test_the_studys_own_picture_agrees_on_every_claim():
  offset = {m: i / 20 for i, m in enumerate(sizes_lib.MIXERS)}  # HGRN best alone (2.200)
  # bits per byte flat in the ratio but for HGRN-2, best at 6:1 and 3:1 (2.190); recall rising
  # with the share of attention
  results = grid(bpb=lambda m, q: 2.2 + offset[m] - (0.06 if m == "hgrn2" and q in ("6:1", "3:1") else 0),
                 recall=lambda m, q: 0.2 + 2 * SHARE[q])
  q = claims.claim_quality(results)
  assert q["verdict"] == "agrees" and q["mixers"] == list(sizes_lib.MIXERS) and 0 < q["span"] < 0.01
  r = claims.claim_recall(results, (512, 64))
  assert r["verdict"] == "agrees (over 6 mixers)" and abs(r["pure"] - 0.2) < 1e-9 and r["rho"] > 0.9
  assert claims.claim_recall(results, "ruler_mean")["verdict"] == "cannot tell: 0 in every cell"
  best = claims.claim_best_mixer(results, "heldout_bits_per_byte", higher_is_better=False)
  assert best["best"]["pure"][0] == "hgrn" and best["best"]["6:1"][0] == "hgrn2"
  assert best["verdict"] == "agrees"
  md = claims.claims_markdown(results)
  assert "| MQAR at 512 tokens, 64 pairs | 0.200 | 0.700 | 0.900 |" in md
  assert "| held-out bits per byte | HGRN 2.200 (of 6) | HGRN-2 2.190 (of 6) |" in md
  assert md.count("**Verdict: agrees.**") == 1
  assert "| MQAR at 512 tokens, 64 pairs | 0.283 | 0.367 | 0.450 | 0.700 | 0.200 | 3:1 |" in md
  assert "| RULER-style mean | 0.000 | 0.000 | 0.000 | 0.000 | 0.000 | - |" in md


def test_recall_that_peaks_below_3_to_1_says_where():
  peak = {"24:1": 0.6, "12:1": 0.9, "6:1": 0.85, "3:1": 0.7, "pure": 0.02}  # the small grid's shape
  results = grid(bpb=lambda m, q: 2.0, recall=lambda m, q: peak[q])
  r = claims.claim_recall(results, (512, 64))
  assert r["by_ratio"] == pytest.approx(peak)
  assert r["verdict"] == "agrees (over 6 mixers)"  # the rule reads the ends, the table the shape
  assert "| 0.600 | 0.900 | 0.850 | 0.700 | 0.020 | 12:1 |" in claims.claims_markdown(results)


def test_quality_moving_with_the_ratio_disagrees():
  results = grid(bpb=lambda m, q: 2.0 + SHARE[q], recall=lambda m, q: 0.5)
  q = claims.claim_quality(results)
  assert q["verdict"] == "disagrees" and q["span"] > claims.QUALITY_SPAN


def test_recall_falling_with_attention_and_one_best_mixer_disagree():
  results = grid(bpb=lambda m, q: 2.0 + (0 if m == "gla" else 0.1), recall=lambda m, q: 0.9 - SHARE[q])
  assert claims.claim_recall(results, (512, 64))["verdict"].startswith("disagrees")
  assert claims.claim_recall(results, "mqar_mean")["verdict"].startswith("disagrees")
  assert claims.claim_best_mixer(results, "heldout_bits_per_byte", False)["verdict"] == "disagrees"


def test_a_partial_grid_cannot_tell():
  results = [r for r in grid(bpb=lambda m, q: 2.0, recall=lambda m, q: 0.5)
             if r["name"] in ("gated_deltanet_pure", "gated_deltanet_3:1", "transformer")]
  assert claims.claim_quality(results)["verdict"].startswith("cannot tell")
  assert claims.claim_best_mixer(results, "heldout_bits_per_byte", False)["verdict"].startswith("cannot tell")
  r = claims.claim_recall(results, (512, 64))
  assert r["verdict"] == "disagrees (over 1 mixer)" and r["rho"] is None  # two cells: no rank test
  assert "cannot tell" in claims.claims_markdown([])
