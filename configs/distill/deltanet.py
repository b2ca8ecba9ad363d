"""SmolLM2-135M-Instruct -> DeltaNet student (`:hybrid` keeps attention at 3, 7, ..., 27).

    python -m lineax_lm.distill --config configs/distill/deltanet.py[:hybrid] --workdir runs/distill/deltanet
    python -m lineax_lm.distill --config configs/distill/deltanet.py:runlocal --workdir /tmp/distill_deltanet
Expected: runlocal ~1 min on CPU, every stage's loss falls; the full run and its figures:
lineax_lm/distill/README.md and launch/distill_h200.sh.
"""
from lineax_lm.distill.config import distill_config


def get_config(arg=None):
  return distill_config("deltanet", arg)
