"""MQAR sweep on CPU: gated delta rule vs GLA vs linear attention at equal state size, the plain delta
rule, and a 3:1 Gated DeltaNet hybrid (Zoology protocol: best accuracy over learning rates).

  python -m lineax_lm.eval.sweep --config configs/mqar_sweep.py --workdir runs/mqar_sweep

Produces runs/mqar_sweep/{best,results}.{md,csv,json}, accuracy_vs_width.png and pareto.png (one
subfolder per point under points/; a rerun skips finished points and resumes an interrupted one).
Time: 18 points of 800 steps (batch 32 x 64 tokens); 25 min on an idle 2-core CPU (53 min shared
with other jobs; 1-2 min per 2-layer point, 2-4.5 min per 4-layer point, one after another).
Expected ordering: gated delta rule > GLA > linear attention; the first run's table (92.2% > 87.9%
> 3.7%; hybrid 97.2% vs 92.2% / 96.5% pure at 2 / 4 layers; the ungated delta rule 99.4%) is in
lineax_lm/eval/README.md, with a rerun on other random draws (96.4% > 92.5% > 3.6%, but the hybrid
93.8%: at this budget hybrid vs pure is within init noise).

`python -m lineax_lm.eval.sweep --config configs/mqar_sweep.py:quick ...` runs a 2-point smoke
version in about a minute.

`configs/mqar_sweep.py:capacity`: the 3:1 hybrid against the pure Gated DeltaNet of its depth (4
layers) where the task is harder for a small state: 24 pairs in 128 tokens, 2,500 steps, lr 1.5e-3,
seeds 0, 1, 2 (6 points; the table reports the mean over seeds with min and max). About an hour on 2
CPU cores, e.g. as two processes sharing the grid:
  for m in 3-1 4l; do python -m lineax_lm.eval.sweep --config configs/mqar_sweep.py:capacity \
    --workdir runs/mqar_capacity --only gated_deltanet_$m & done; wait
  python -m lineax_lm.eval.sweep --config configs/mqar_sweep.py:capacity --workdir runs/mqar_capacity
Expected (lineax_lm/eval/README.md): hybrid mean 0.660 (0.961, 0.955, 0.062) >= pure 0.409 (0.102,
0.982, 0.141); each run either leaves the loss plateau (~0.96-0.98) or stays near chance.

Task: vocabulary 64 (keys 1..31, values 32..63), 64 tokens, 12 key-value pairs, random filler
tokens (Zoology's default); 12 pairs for 16-dim keys per head is near an additive state's capacity.
Models: 2 layers, width 32, two heads of key and value dim 16 for every matrix-state mixer (a
2 x 16 x 16 float32 state per layer), short convolutions on for all (the delta-rule layers'
default; without them additive mixers cannot form the previous-token features MQAR needs in two
layers), the reference (lax.scan) op backend, which is the fastest on CPU at these sizes. The
hybrid has 4 layers (3 Gated DeltaNet + 1 attention: the smallest 3:1 stack); "gated_deltanet_4l"
is the pure Gated DeltaNet of the same depth.
"""
import ml_collections

from lineax_lm.train.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  c = base_config()
  c.model.update(dict(vocab_size=64, num_layers=2, heads=2, backend="reference"))
  c.data.update(dict(seq_len=64, global_batch_size=32))
  c.data.mqar.update(dict(vocab_size=64, num_kv_pairs=12))
  c.train.update(dict(steps=800, warmup_steps=80, log_every=100, checkpoint_every=400,
                      async_checkpointing=False))
  c.eval.update(dict(every=400, steps=8))          # 256 held-out examples x 12 queries
  s.base = c
  conv = {"use_short_conv": True}
  s.mixers = {
      "linear_attn": dict(mixer="linear_attn", mixer_cfg=conv),
      "gla": dict(mixer="gla", mixer_cfg=conv),
      "deltanet": dict(mixer="deltanet", mixer_cfg=conv),
      "gated_deltanet": dict(mixer="gated_deltanet", mixer_cfg=conv),
      "gated_deltanet_4l": dict(mixer="gated_deltanet", mixer_cfg=conv, num_layers=4),
      "gated_deltanet_3:1": dict(mixer="gated_deltanet", mixer_cfg=conv, num_layers=4, attn_ratio="3:1"),
  }
  s.widths = [32]
  s.heads = 2
  s.lrs = [1.5e-3, 3e-3, 6e-3]
  s.equal_state = True
  if arg == "capacity":
    # Past the linear state's capacity: 24 pairs for 16-dim keys, 128 tokens, where the attention
    # layer of the hybrid has to carry the recall (see the docstring).
    c.data.seq_len = 128
    c.data.mqar.num_kv_pairs = 24
    # 2,500 steps: at 1,000 some seeds of either model had not left the loss plateau yet.
    c.train.update(dict(steps=2500, warmup_steps=100, log_every=250, checkpoint_every=500))
    c.eval.update(dict(every=500))
    s.mixers = {k: s.mixers[k] for k in ("gated_deltanet_4l", "gated_deltanet_3:1")}
    s.lrs = [1.5e-3]     # 3e-3 left all six 1,000-step runs (both models, 3 seeds) near chance
    s.seeds = [0, 1, 2]
  elif arg == "quick":
    s.mixers = {k: s.mixers[k] for k in ("gated_deltanet", "gated_deltanet_3:1")}
    s.lrs = [3e-3]
    c.train.update(dict(steps=20, warmup_steps=2, log_every=10, checkpoint_every=20))
    c.eval.update(dict(every=20, steps=1))
  return s
