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
