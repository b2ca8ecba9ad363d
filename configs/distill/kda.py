"""SmolLM2-135M-Instruct -> KDA (Kimi Delta Attention) student (`:hybrid` keeps attention at 3, 7, ..., 27).

    python -m lineax_lm.distill --config configs/distill/kda.py[:hybrid] --workdir runs/distill/kda
    python -m lineax_lm.distill --config configs/distill/kda.py:runlocal --workdir /tmp/distill_kda
Expected: runlocal ~1 min on CPU, every stage's loss falls; the full run and its figures:
lineax_lm/distill/README.md and launch/distill_h200.sh.
"""
from lineax_lm.distill.config import distill_config


def get_config(arg=None):
  return distill_config("kda", arg)
