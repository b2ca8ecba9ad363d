"""The quickstart: small models on MQAR (multi-query associative recall), one per variant.

    python -m lineax_lm.train --config configs/quickstart.py:gdn --workdir runs/demo/gdn
    make demo     # all four variants, then a recall table (lineax_lm/demo.py)

Variants: gdn (pure Gated DeltaNet), linear (pure linear attention), hybrid (3 Gated DeltaNet layers
then 1 attention layer), transformer (all attention). On 2 CPU cores each trains in about a minute;
expected recall accuracy: gdn, hybrid and transformer well above linear attention, which saturates
(see README.md for a measured table). The same command uses a GPU or TPU when present.
"""
from lineax_lm.train.config import base_config

VARIANTS = {
    "gdn": dict(mixer="gated_deltanet", attn_ratio="pure"),
    "linear": dict(mixer="linear_attn", attn_ratio="pure"),
    "hybrid": dict(mixer="gated_deltanet", attn_ratio="3:1"),
    "transformer": dict(mixer="gated_deltanet", attn_ratio="transformer"),
}
# Mixer sizes with comparable recurrent state: GDN 2 heads x 32 x 32, linear attention 2 heads of
# 8 key dims expanded to 64 by its elementwise-product feature map, x 32 value dims.
MIXER_CFG = {"gated_deltanet": dict(num_heads=2, head_dim=32, expand_v=1.0),
             "linear_attn": dict(num_heads=2, expand_k=0.25, expand_v=1.0)}


def get_config(variant: str = "gdn"):
  if variant not in VARIANTS:
    raise ValueError(f"quickstart variant must be one of {sorted(VARIANTS)}; got {variant!r}")
  c = base_config()
  c.model.update(dict(vocab_size=64, num_layers=4, hidden=64, heads=2, **VARIANTS[variant]))
  c.model.mixer_cfg = MIXER_CFG[c.model.mixer]
  c.data.update(dict(source="mqar", seq_len=64, global_batch_size=32))
  c.data.mqar.update(dict(vocab_size=64, num_kv_pairs=8))
  c.train.update(dict(steps=500, lr=1e-2, warmup_steps=50, weight_decay=0.1, log_every=50,
                      checkpoint_every=250))
  c.eval.update(dict(every=250, steps=8))
  return c
