"""The grid's tables read in the study's order, whatever order the cells finished in."""
from lineax_lm.experiments import sizes, tables


def test_tables_order_mixers_and_ratios_as_the_study_does():
  # results in the order cells happen to finish: the tables still read 24:1 ... pure, then the
  # Transformer, and the mixers in the study's order
  cells = [("gla", "pure"), ("transformer", "transformer"), ("hgrn", "6:1"), ("gla", "24:1")]
  results = [dict(name=f"{m}_{r}", mixer=m, ratio=r, label=sizes.label(m), size="small",
                  heldout_bits_per_byte=2.0 + i / 10) for i, (m, r) in enumerate(cells)]
  table = tables.tables_markdown(results).split("## Held-out bits per byte")[1]
  assert "| mixer | 24:1 | 6:1 | pure | Transformer |" in table
  assert table.index("| HGRN | ") < table.index("| GLA | ") < table.index("| Transformer | -")
  assert "| GLA | 2.300 | - | 2.000 | - |" in table


def test_share_plots_show_the_mean_over_seeds_and_its_interval(tmp_path):
  """Each point of a plot against the share of attention is a cell's mean over its seeds with the
  half-width of its 95% interval (none for one seed); the Transformer sits at share 1 once."""
  import os
  import pytest
  from lineax_lm.experiments import claims, plots
  row = lambda m, r, seed, v, share: dict(name=f"{m}_{r}_{seed}", mixer=m, ratio=r, seed=seed,
                                          label=sizes.label(m), attention_share=share, mqar_mean=v)
  results = [row("gated_deltanet", "3:1", 0, 0.5, 0.25), row("gated_deltanet", "3:1", 1, 0.7, 0.25),
             row("gated_deltanet", "3:1", 2, 0.6, 0.25), row("gated_deltanet", "pure", 0, 0.1, 0.0),
             row("transformer", "transformer", 0, 0.9, 1.0)]
  points = {p[plots.SHARE]: p for p in plots.share_points(results, "mqar_mean", "MQAR")}
  assert sorted(points) == [0.0, 0.25, 1.0]
  assert points[0.25]["MQAR"] == pytest.approx(0.6)
  assert points[0.25][plots.INTERVAL] == pytest.approx(claims.interval([0.5, 0.7, 0.6])[1])
  assert points[0.0][plots.INTERVAL] is None and points[1.0]["MQAR"] == pytest.approx(0.9)
  plots.write_plots(results, str(tmp_path))
  assert os.path.exists(tmp_path / "mqar_vs_attention.png")
