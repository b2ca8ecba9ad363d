"""Linearization: distil a Transformer teacher into linear and hybrid students (see README.md).

  checkpoints.py  teacher loading: GGUF files / HF safetensors dirs -> HF-named float32 params
  teacher.py      the teacher as an all-attention HybridLM; a tiny random teacher (runlocal)
  student.py      student configs and initialisation from the teacher (mapping table)
  losses.py       the stage losses (layer / block alignment, end-to-end CE + KL)
  data.py         teacher tokenizer for the data stack, text sampled from the teacher
  chat.py         ChatML rendering and assistant-only masks for the SFT stage
  config.py       the distillation config, a student and switches (configs/distill.py:<student>)
  pipeline.py     the run object (Distillation): stages in order (resumable) and the evaluation
  study.py        the linearization study: every student, one token budget, one table
                  (launch/distill_h200.sh, docs/linearization_study.md)
  python -m lineax_lm.distill --config configs/distill.py:<student>[,hybrid][,runlocal] --workdir DIR
"""
