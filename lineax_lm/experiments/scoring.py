"""The scores of a model (`score_model`: held-out perplexity and bits per byte, the RULER-style
tasks, MQAR, efficiency), of a trained cell (`score_cell`: its run's model on its held-out split,
with its training FLOPs), a cell's needle curve (`score_needle_curve`: the needle tasks at every
kept checkpoint, `<cell>/needle_curve.json`) and the positive control, a teacher scored on the
same RULER-style tasks (`<out>/control.json`)."""
from __future__ import annotations

import json
import os
import tempfile
import time

from lineax_lm.eval import report
from lineax_lm.experiments.cells import NEEDLE_CURVE_FILE, heldout_config

# MQAR is scored on token ids < MQAR_VOCAB (the byte vocabulary; a BPE model sees the same ids):
# keys from the lower half, values from the upper, so a uniform guess among the values scores
# 1 / (MQAR_VOCAB // 2).
MQAR_VOCAB = 256


def score_cell(cell_dir: str, size, scored_ruler=None) -> dict:
  """Loads the cell's trained model and scores it on its own held-out split (`score_model`;
  `scored_ruler`: its RULER-style rows, already scored on the final checkpoint), with the training
  FLOPs its run config gives."""
  from lineax_lm.eval.efficiency import model_costs
  from lineax_lm.eval.loading import data_tokenizer, load_checkpoint
  trained, run_config, _ = load_checkpoint(os.path.join(cell_dir, "run"))
  out = score_model(trained, data_tokenizer(run_config),
                    heldout_documents(heldout_config(run_config), size.ppl_documents), size,
                    max_len=run_config.data.seq_len, scored_ruler=scored_ruler)
  train_costs = model_costs(trained.config, run_config.data.seq_len // 2)
  per_token = (train_costs["projection_flops"] + train_costs["mixing_flops"]
               + 2 * trained.config.hidden * trained.config.vocab_size)  # forward, causal mean context
  out["train_flops"] = (3.0 * per_token * run_config.train.steps * run_config.data.seq_len
                        * run_config.data.global_batch_size)
  return out


def heldout_documents(data_config, count: int) -> list[str]:
  """The first `count` documents of a data config section's held-out split (`heldout_config`)."""
  from lineax_lm.data.pipeline import make_source
  src = make_source(data_config, seed=0)
  return [src[i] for i in range(min(len(src), count))]


def score_model(trained, tokenizer, documents: list[str], size, *, max_len: int,
                scored_ruler=None) -> dict:
  """The scores of the module docstring (all but the training FLOPs) of model `trained` (a
  HybridLM) under `size`'s evaluation settings: held-out perplexity and bits per byte of
  `documents` in rolling windows of `max_len` tokens of `tokenizer`, the RULER-style tasks, MQAR
  and the efficiency rows. `scored_ruler`: the RULER-style rows of this model, every task of the
  size already scored under its settings (the needle curve's final point), taken instead of
  scoring."""
  import numpy as np
  from lineax_lm.eval import efficiency, language, mqar, ruler
  from lineax_lm.eval.scoring import MIN_BUCKET, Scorer
  # Every scored row (perplexity windows, RULER prompts of every length, MQAR) padded to
  # size.eval_length: one compiled program for the model, where a small model's compile on a GPU
  # costs far more than the padded compute.
  model = Scorer(trained, size.eval_batch, min_length=size.eval_length or MIN_BUCKET)
  out = {}
  t = time.time()
  ppl = language.perplexity(model, tokenizer, documents, max_len=max_len, batch_size=size.eval_batch)
  out.update(heldout_perplexity=ppl["perplexity"], heldout_bits_per_byte=ppl["bits_per_byte"],
             heldout_tokens=ppl["tokens"])
  rows = list(scored_ruler) if scored_ruler is not None else ruler_rows(
      trained, tokenizer, size, size.ruler_tasks, scorer=model)
  out["ruler"] = rows
  out.update(ruler.ruler_means(rows))
  mq = [dict(seq_len=L, num_kv_pairs=n, accuracy=mqar.mqar_accuracy(
      model, vocab_size=min(MQAR_VOCAB, trained.config.vocab_size), seq_len=L,
      num_kv_pairs=n, num_examples=size.mqar_examples, batch_size=size.eval_batch))
      for L, n in size.mqar]
  out["mqar"] = mq
  out["mqar_mean"] = float(np.mean([r["accuracy"] for r in mq])) if mq else None
  out["eval_seconds"] = round(time.time() - t, 1)
  costs = [efficiency.model_costs(trained.config, L) for L in size.efficiency_lengths]
  out.update(params=costs[0]["params"],
             efficiency=[dict(context_len=c["context_len"], mixing_MFLOPs_per_token=c["mixing_flops"] / 1e6,
                              decode_mixing_MFLOPs=c["decode_mixing_flops"] / 1e6,
                              cache_MiB=c["cache_bytes"] / 2**20, kv_cache_MiB=c["kv_cache_bytes"] / 2**20,
                              state_MiB=c["state_cache_bytes"] / 2**20) for c in costs])
  return out


def ruler_rows(trained, tokenizer, size, tasks, scorer=None) -> list[dict]:
  """`tasks` of the RULER-style suite at the size's lengths, examples and scoring
  (lineax_lm.eval.ruler.evaluate_tasks rows); teacher-forced scoring reads `scorer` (a Scorer of
  `trained`; one is made when None), generation the model itself."""
  from lineax_lm.eval import ruler
  model = trained
  if size.ruler_mode == "teacher_forced":
    from lineax_lm.eval.scoring import MIN_BUCKET, Scorer
    model = scorer or Scorer(trained, size.eval_batch, min_length=size.eval_length or MIN_BUCKET)
  return ruler.evaluate_tasks(model, tokenizer, tasks=list(tasks), lengths=size.ruler_lengths,
                              num_examples=size.ruler_examples, mode=size.ruler_mode,
                              batch_size=size.eval_batch)


# ----------------------------------------------------------------------------- the needle curve
def needle_tasks(size) -> list[str]:
  """The needle-in-a-haystack tasks (niah_*) among the size's RULER-style tasks."""
  return [t for t in size.ruler_tasks if t.startswith("niah")]


def curve_settings(size) -> dict:
  """What a needle curve's points were scored under: a curve of other settings is scored again."""
  return dict(tasks=needle_tasks(size), lengths=list(size.ruler_lengths),
              examples=size.ruler_examples, mode=size.ruler_mode)


def curve_steps(run_dir: str) -> list[int]:
  """The kept checkpoints of a run at its marks: every `train.checkpoint_every` steps and the final
  step (a step saved because a signal stopped the run is not a mark: the curves of two cells stay
  at the same token counts)."""
  from lineax_lm.eval.loading import load_config
  from lineax_lm.train import checkpoint
  if not os.path.isdir(checkpoint.checkpoint_dir(run_dir)):
    return []
  mngr = checkpoint.reader(run_dir)
  try:
    steps = sorted(mngr.all_steps())
  finally:
    mngr.close()
  if not steps:
    return []
  train = load_config(run_dir, steps[-1]).train
  return [s for s in steps if s % train.checkpoint_every == 0 or s == train.steps]


def score_needle_curve(cell_dir: str, size, progress: bool = True) -> dict:
  """The needle tasks (`needle_tasks`, at the size's lengths, examples and scoring) of the cell's
  run (`<cell_dir>/run`, finished or not) at each of its kept checkpoint marks (`curve_steps`),
  with the training tokens each had seen; needle_curve.json is rewritten after each checkpoint,
  and a checkpoint it already holds under the same settings is not scored again. Returns it."""
  from tqdm import tqdm
  from lineax_lm.eval.loading import data_tokenizer, load_checkpoint
  run_dir, path = os.path.join(cell_dir, "run"), os.path.join(cell_dir, NEEDLE_CURVE_FILE)
  settings = curve_settings(size)
  curve = None
  if os.path.exists(path):
    with open(path) as f:
      curve = json.load(f)
  if not curve or curve.get("settings") != settings:
    curve = dict(name=os.path.basename(cell_dir), settings=settings, points=[])
  done = {p["step"] for p in curve["points"]}
  todo = [s for s in curve_steps(run_dir) if s not in done]
  bar = tqdm(todo, unit="checkpoint", desc=f"needle curve {curve['name']}",
             disable=not progress or not todo, dynamic_ncols=True)
  for step in bar:
    trained, config, _ = load_checkpoint(run_dir, step)
    model_cfg = trained.config
    curve.update(mixer="transformer" if model_cfg.attn_ratio == "transformer" else model_cfg.mixer,
                 ratio=model_cfg.attn_ratio, seed=config.seed)
    rows = ruler_rows(trained, data_tokenizer(config), size, settings["tasks"])
    curve["points"].append(dict(step=step, tokens=step * config.data.global_batch_size
                                * config.data.seq_len, ruler=rows))
    curve["points"].sort(key=lambda p: p["step"])
    report.write_json(path, curve)
  return curve


CONTROL_FILE = "control.json"
CONTROLS = {"smollm2": "SmolLM2-135M-Instruct, the distillation teacher (8k context, BPE tokens)",
            "tiny": "the random tiny teacher (a control that must fail: for tests)"}


def score_control(size, out: str, teacher: str = "smollm2") -> dict:
  """The positive control of the recall tables: `teacher` (lineax_lm.experiments.corpus'
  `load_sampling_teacher`) on the size's RULER-style tasks, lengths (in its own tokens) and scoring,
  written to `<out>/control.json`. A trained model that must score above 0: while it does not, a
  cell's 0 says nothing (claims.claim_recall)."""
  from lineax_lm.eval import ruler
  from lineax_lm.experiments.corpus import load_sampling_teacher
  if teacher not in CONTROLS:
    raise ValueError(f"`--control` must be one of {sorted(CONTROLS)}; got {teacher!r}")
  with tempfile.TemporaryDirectory() as folder:   # the teacher's tokenizer files, read at once
    model, tokenizer, _ = load_sampling_teacher(teacher, folder)
  start = time.time()
  rows = ruler.evaluate_tasks(model, tokenizer, tasks=list(size.ruler_tasks), lengths=size.ruler_lengths,
                              num_examples=size.ruler_examples, mode=size.ruler_mode,
                              batch_size=size.eval_batch, progress=True)
  result = dict(name=teacher, description=CONTROLS[teacher], settings=control_settings(size), ruler=rows,
                **ruler.ruler_means(rows), eval_seconds=round(time.time() - start, 1))
  report.write_json(os.path.join(out, CONTROL_FILE), result)
  return result


def control_settings(size) -> dict:
  """The evaluation settings a control was scored under: a control of other settings is redone."""
  return dict(tasks=list(size.ruler_tasks), lengths=list(size.ruler_lengths),
              examples=size.ruler_examples, mode=size.ruler_mode)


def ensure_control(size, out: str, teacher: str) -> dict:
  """`<out>/control.json` when it holds `teacher` under the size's settings, else `score_control`."""
  held = load_control(out)
  if held and held["name"] == teacher and held.get("settings") == control_settings(size):
    return held
  return score_control(size, out, teacher)


def load_control(out: str) -> dict | None:
  path = os.path.join(out, CONTROL_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
