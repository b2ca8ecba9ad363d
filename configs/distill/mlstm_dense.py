"""SmolLM2-135M-Instruct -> xLSTM's mLSTM student with dense q/k/v (`:hybrid` keeps attention at 3, 7, ...).

The block-diagonal mLSTM (configs/distill/mlstm.py) cannot take the teacher's q/k projections; this
variant projects q, k and v densely from the layer input (`mixer_cfg.qkv_proj="dense"`, as
xLSTM-7B's layer), so it starts from all four of the teacher's attention projections like the other
students: the pair separates "xLSTM's recurrence" from "xLSTM's projections started at random".

    python -m lineax_lm.distill --config configs/distill/mlstm_dense.py --workdir runs/distill/mlstm_dense
"""
from lineax_lm.distill.config import distill_config


def get_config(arg=None):
  c = distill_config("mlstm", arg)
  c.student.mixer_cfg.qkv_proj = "dense"
  return c
