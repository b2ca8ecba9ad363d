"""SmolLM2-135M-Instruct -> linear attention (Hadamard feature map) student (`:hybrid` keeps attention at 3, 7, ..., 27).

    python -m lineax_lm.distill --config configs/distill/linear_attn.py[:hybrid] --workdir runs/distill/linear_attn
    python -m lineax_lm.distill --config configs/distill/linear_attn.py:runlocal --workdir /tmp/distill_linear_attn
Expected: runlocal ~1 min on CPU, every stage's loss falls; the full run and its figures:
lineax_lm/distill/README.md and launch/distill_h200.sh.
"""
from lineax_lm.distill.config import distill_config


def get_config(arg=None):
  return distill_config("linear_attn", arg)
