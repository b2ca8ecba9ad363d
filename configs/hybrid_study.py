"""One cell of the hybrid-ratio study as a plain training run (the grid runs every cell and scores
them: python -m lineax_lm.experiments.grid, docs/hybrid_study.md).

    python -m lineax_lm.train --config configs/hybrid_study.py:small,gla,6:1 --workdir runs/gla_6-1
    python -m lineax_lm.train --config configs/hybrid_study.py:small,gla,6:1 --workdir runs/gla_6-1 \
        --config.data.paths='corpora/mine/train-*.jsonl' \
        --config.data.heldout_paths=corpora/mine/heldout.jsonl
    python -m lineax_lm.train --config configs/hybrid_study.py:340m,gated_deltanet,3:1 --workdir ... \
        --config.data.source=parquet --config.data.paths='fineweb-edu/sample/100BT/*.parquet' \
        --config.data.tokenizer=tokenizer.json

The argument is "size,mixer,ratio" (sizes and cells: lineax_lm.experiments.sizes); "size,transformer"
is the Transformer of a size. The token budget is `train.tokens` (steps follow from it). The data is
the size's shipped corpus, as in the grid (`small`: corpora/smollm2_samples); 340m / 1.3b name theirs.
"""
from lineax_lm.experiments import cells, sizes


def get_config(arg: str = "small,gated_deltanet,3:1"):
  parts = [p.strip() for p in arg.split(",")]
  if len(parts) == 2 and parts[1] == "transformer":
    parts.append("transformer")
  if len(parts) != 3:
    raise ValueError(f"config argument must be 'size,mixer,ratio' or 'size,transformer'; got {arg!r}")
  size, mixer, ratio = parts
  if (mixer, ratio, 0) not in sizes.all_cells(sizes.SIZES["small"]):
    raise ValueError(f"no cell {mixer}:{ratio}; mixers {sizes.MIXERS}, ratios {sizes.RATIOS}")
  c = sizes.cell_config(sizes.get_size(size), mixer, ratio)
  c.data.update(cells.corpus_data(cells.default_corpus(sizes.get_size(size))))
  return c
