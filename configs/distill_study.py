"""One student of the linearization study (lineax_lm.distill.study), as a config file.

    python -m lineax_lm.distill --config configs/distill_study.py:gla --workdir runs/study/gla
    python -m lineax_lm.distill --config configs/distill_study.py:kda,hybrid --workdir runs/study/kda_h
The argument: a study student (mlstm, mlstm_dense, gla, gated_deltanet, deltanet, retention, kda,
linear_attn), then optional switches hybrid / runlocal. `python -m lineax_lm.distill.study` runs them
all with one table; this file runs one with the study's settings (`--config.<field>=...` overrides).

Budget: 2e6 training tokens per student by default (`lineax_lm.distill.study --tokens`, the single
knob: 3e9 is the study's order of budget), rows of 4 x 2,048 tokens (8,192 tokens a step), split
over the stages 0.2 / 0.2 / 0.6, warmup 10% of each stage:

| stage | share | steps at 2e6 | lr | trains | why |
|---|---|---|---|---|---|
| 1 layer | 0.2 | 49 | 1e-3 | linear mixers | a per-layer regression onto the attention output, on the teacher's own inputs: converges in a few hundred steps and tolerates a high lr (nothing else moves) |
| 2 block | 0.2 | 49 | 3e-4 | linear blocks (mixer, norms, MLP) | the MLP adapts to its new mixer, block by block, on the teacher's h_i; the MLPs start right, so a lower lr |
| 3 e2e | 0.6 | 146 | 1e-4 | everything | CE + KL to the teacher's logits: corrects the errors that compound across layers, where the recovery comes from, hence most of the budget; every weight starts near a good point, so the lowest lr |

Data: 4,096 teacher samples (<= 512 tokens) joined into documents of >= 2,048 tokens, so the needle
at 2,048 is inside the training length (lineax_lm/distill/data.py says what such a document is).
The curve keeps an e2e checkpoint every e2e_steps / 3 steps and scores each.
"""
from lineax_lm.distill.config import config_argument, split_switches
from lineax_lm.distill.study import study_config


def get_config(arg=None):
  student, switches = config_argument(arg)
  switches = split_switches(switches)
  runlocal = "runlocal" in switches  # the tiny teacher: ~25 steps of 8 x 64 tokens, not 2e6 tokens
  return study_config(student, 1.2e4 if runlocal else 2e6, hybrid="hybrid" in switches,
                      runlocal=runlocal)
