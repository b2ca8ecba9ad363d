"""SmolLM2-135M-Instruct -> a linear or hybrid student: the argument names it, then switches.

    python -m lineax_lm.distill --config configs/distill.py:gated_deltanet --workdir runs/gdn
    python -m lineax_lm.distill --config configs/distill.py:gla,hybrid --workdir runs/gla_hybrid
    python -m lineax_lm.distill --config configs/distill.py:kda,runlocal --workdir /tmp/kda

The student: mlstm, mlstm_dense (mLSTM with dense q/k/v projections), gla, gated_deltanet (the
default), deltanet, retention, kda or linear_attn (lineax_lm.distill.config.STUDENTS). Switches:
`hybrid` keeps attention at layers 3, 7, ..., 27; `runlocal` is a tiny random teacher and a few
steps (~1 min on CPU, every stage's loss falls). The full run and its figures:
lineax_lm/distill/README.md and launch/distill_h200.sh.
"""
from lineax_lm.distill.config import config_argument, distill_config


def get_config(arg=None):
  return distill_config(*config_argument(arg))
