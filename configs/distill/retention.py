"""SmolLM2-135M-Instruct -> RetNet (multi-scale retention) student (`:hybrid` keeps attention at 3, 7, ..., 27).

    python -m lineax_lm.distill --config configs/distill/retention.py[:hybrid] --workdir runs/distill/retention
    python -m lineax_lm.distill --config configs/distill/retention.py:runlocal --workdir /tmp/distill_retention
Expected: runlocal ~1 min on CPU, every stage's loss falls; the full run and its figures:
lineax_lm/distill/README.md and launch/distill_h200.sh.
"""
from lineax_lm.distill.config import distill_config


def get_config(arg=None):
  return distill_config("retention", arg)
