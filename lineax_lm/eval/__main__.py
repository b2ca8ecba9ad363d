"""python -m lineax_lm.eval --workdir DIR [--tasks mqar,needle,ruler,ppl,efficiency] [options]

Restores the latest (or --step) checkpoint of a training run, runs the chosen evaluations and
writes markdown tables (+ CSV / JSON) and PNG plots into DIR/eval/, printing the tables.

Tasks (comma-separated; default: mqar,efficiency for an MQAR run, ppl,needle,efficiency otherwise):
  mqar        teacher-forced MQAR accuracy over --mqar_lengths x --mqar_kv_pairs (the run's vocab)
  needle      RULER needle tasks (niah_*), accuracy per context length (--lengths)
  ruler       every recall task: needle tasks + vt, cwe, fwe;  or any task names (niah_single, vt, ...)
  ppl         perplexity / bits per byte on held-out text (--ppl_paths files, or --ppl_tfds_split
              of the run's TFDS dataset)
  efficiency  token-mixing FLOPs per token, cache bytes, measured forward tokens/s; Pareto PNG
Recall tasks are scored by greedy generation (--mode generate, the model's generate()) or by
teacher-forced exact match of the canonical answer (--mode teacher_forced, one forward pass; much
cheaper on CPU).
"""
from __future__ import annotations

import argparse
import os
import sys

from lineax_lm.eval import report

RECALL = ("needle", "ruler")


def _integer(low: int):
  """An argparse type: an integer >= low (a length or count below 1 would give an empty table)."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
      raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
    return value
  return parse


def _positive_ints(text: str) -> list[int]:
  """An argparse type: comma-separated integers >= 1, at least one."""
  values = [_integer(1)(x.strip()) for x in text.split(",") if x.strip()]
  if not values:
    raise argparse.ArgumentTypeError(f"{text!r} holds no integer (give e.g. 512,1024)")
  return values


def _task_names(text: str) -> str:
  """An argparse type: comma-separated task names, at least one."""
  if not any(t.strip() for t in text.split(",")):
    raise argparse.ArgumentTypeError(f"{text!r} names no task (give e.g. ppl,needle)")
  return text


def check_scoring_memory(model, lengths: list[int], batch_size: int, flag: str):
  """Refuses teacher-forced scoring of `lengths` whose batch cannot fit in memory, before any
  example is scored: compiles the scorer for the longest (the evaluation then reuses that program)
  and compares XLA's account of its memory with the device's."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from lineax_lm.eval import scoring
  from lineax_lm.models.generate import check_memory
  graphdef, state = nnx.split(model)
  tokens = jax.ShapeDtypeStruct((batch_size, scoring.bucket(max(lengths))), jnp.int32)
  stats = scoring._jitted_scores(graphdef).lower(state, tokens, tokens).compile().memory_analysis()
  if stats is None:  # a backend without the analysis: the evaluation finds out
    return
  needed = stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes
  check_memory(needed, f"{flag}={max(lengths)} with --batch_size={batch_size} (a batch of "
                       f"{tokens.shape[0]} x {tokens.shape[1]} tokens)")


def parse_args(argv=None):
  """The parsed command line; a length, count or size below 1 is an error naming its argument."""
  p = argparse.ArgumentParser(prog="python -m lineax_lm.eval", description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="training run directory (with checkpoints/)")
  p.add_argument("--step", type=_integer(0), default=None, help="checkpoint step (default: latest)")
  p.add_argument("--tasks", type=_task_names, default=None,
                 help="comma-separated tasks (see the module docstring)")
  p.add_argument("--out", default=None, help="output folder (default: WORKDIR/eval)")
  p.add_argument("--lengths", type=_positive_ints, default="512,1024,2048,4096,8192",
                 help="recall context lengths")
  p.add_argument("--num_examples", type=_integer(1), default=20,
                 help="examples per recall task and length")
  p.add_argument("--mode", default="generate", choices=("generate", "teacher_forced"))
  p.add_argument("--corpus", default=None, help="text files (comma-separated / globs) for haystacks")
  p.add_argument("--tokenizer", default=None, help="'byte' or a tokenizer.json (default: the run's)")
  p.add_argument("--mqar_lengths", type=_positive_ints, default=None,
                 help="MQAR lengths (default: the run's seq_len, x2, x4)")
  p.add_argument("--mqar_kv_pairs", type=_positive_ints, default=None,
                 help="MQAR kv pairs (default: the run's, /2, x2)")
  p.add_argument("--mqar_examples", type=_integer(1), default=256)
  p.add_argument("--ppl_paths", default=None, help="held-out text files for ppl (the run's format)")
  p.add_argument("--ppl_tfds_split", default=None, help="held-out TFDS split for ppl (e.g. validation)")
  p.add_argument("--ppl_documents", type=_integer(1), default=200,
                 help="at most this many documents")
  p.add_argument("--max_len", type=_integer(1), default=None,
                 help="ppl window (default: the run's seq_len)")
  p.add_argument("--efficiency_lengths", type=_positive_ints, default="2048,8192,32768")
  p.add_argument("--batch_size", type=_integer(1), default=8)
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def run(args) -> dict:
  """Runs the evaluations of parsed `args`; returns {task: markdown section}."""
  from lineax_lm.eval import efficiency, language, mqar, ruler
  from lineax_lm.eval.loading import data_tokenizer, load_checkpoint, load_config
  from lineax_lm.data.text import resolve_paths

  config = load_config(args.workdir, args.step)       # the JSON beside the checkpoint: cheap
  is_mqar = config.data.source == "mqar"
  tasks = [t.strip() for t in (args.tasks or ("mqar,efficiency" if is_mqar else
                                             "ppl,needle,efficiency")).split(",") if t.strip()]
  recall_tasks = [t for t in tasks if t in RECALL or t in ruler.TASKS]
  unknown = [t for t in tasks if t not in ("mqar", "ppl", "efficiency") and t not in recall_tasks]
  if unknown:
    raise ValueError(f"`--tasks`: unknown task(s) {unknown}; see `python -m lineax_lm.eval --help`")
  if "ppl" in tasks and is_mqar:
    raise ValueError(f"`--tasks` ppl measures text, and {args.workdir} trained on MQAR token ids "
                     "(no text tokenizer, a vocabulary of MQAR ids): drop ppl from --tasks")
  if "ppl" in tasks and not (args.ppl_paths or args.ppl_tfds_split):
    raise ValueError("`ppl` needs held-out text: pass --ppl_paths FILES (the run's text / jsonl "
                     "format) or --ppl_tfds_split SPLIT of the run's TFDS dataset")
  tokenizer = data_tokenizer(config)
  if args.tokenizer:
    from lineax_lm.data.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(args.tokenizer)
  model, config, step = load_checkpoint(args.workdir, args.step)
  out = args.out or os.path.join(args.workdir, "eval")
  os.makedirs(out, exist_ok=True)
  sections = {}
  title = f"{os.path.basename(os.path.abspath(args.workdir))} (step {step})"

  if "mqar" in tasks:
    m, L = config.data.mqar, config.data.seq_len
    lengths = args.mqar_lengths or [L, 2 * L, 4 * L]
    kvs = (args.mqar_kv_pairs or
           sorted({max(1, m.num_kv_pairs // 2), m.num_kv_pairs, 2 * m.num_kv_pairs}))
    check_scoring_memory(model, lengths, args.batch_size, "--mqar_lengths")
    rows = mqar.mqar_grid(model, vocab_size=m.vocab_size, seq_lens=lengths, kv_pairs=kvs,
                          num_examples=args.mqar_examples, batch_size=args.batch_size,
                          power_a=m.power_a, random_non_queries=m.random_non_queries)
    if not rows:
      raise ValueError(f"`--mqar_lengths` {lengths} x `--mqar_kv_pairs` {kvs}: no pair fits (a "
                       f"length holds at most length / 4 pairs, and a vocabulary of {m.vocab_size} "
                       f"at most {m.vocab_size // 2 - 1}); nothing to evaluate")
    report.write_rows(rows, os.path.join(out, "mqar"), title=f"MQAR accuracy: {title}")
    if rows:
      report.line_plot(rows, x="num_kv_pairs", y="accuracy", group="seq_len",
                       path=os.path.join(out, "mqar.png"), title=f"MQAR: {title}", ylim=(0, 1.02))
    sections["mqar"] = f"## MQAR accuracy: {title} (rows: length)\n\n{mqar.format_grid(rows)}\n"

  if recall_tasks:
    if tokenizer is None or tokenizer.vocab_size > model.config.vocab_size:
      raise ValueError("recall tasks need a text tokenizer whose ids fit the model's vocabulary; this "
                       "run has none (MQAR) or a larger one: pass --tokenizer")
    corpus = None
    if args.corpus:
      corpus = [open(f, encoding="utf-8").read() for f in resolve_paths(args.corpus)]
    rows = ruler.evaluate_tasks(model, tokenizer, recall_tasks, args.lengths, args.num_examples,
                                args.seed, args.mode, corpus, args.batch_size)
    report.write_rows(rows, os.path.join(out, "recall"), title=f"Recall tasks ({args.mode}): {title}")
    report.line_plot(rows, x="length", y="accuracy", group="task", path=os.path.join(out, "recall.png"),
                     title=f"Recall accuracy ({args.mode}): {title}", logx=True, ylim=(0, 1.02))
    table = report.pivot_table(rows, row="task", col="length", value="accuracy")
    sections["recall"] = f"## Recall accuracy ({args.mode}): {title}\n\n{table}\n"

  if "ppl" in tasks:
    data = config.data.copy_and_resolve_references()
    with data.unlocked():
      if args.ppl_paths:
        data.paths = args.ppl_paths
      if args.ppl_tfds_split:
        data.tfds_split = args.ppl_tfds_split
      if args.tokenizer:
        data.tokenizer = args.tokenizer
    docs = language.heldout_documents(data, max_documents=args.ppl_documents)
    res = language.perplexity(model, tokenizer, docs, max_len=args.max_len or config.data.seq_len,
                              batch_size=args.batch_size)
    sections["ppl"] = report.write_rows(
        [res], os.path.join(out, "ppl"), title=f"Held-out language metrics: {title}")

  if "efficiency" in tasks:
    rows = efficiency.efficiency_rows({title: model}, args.efficiency_lengths,
                                      measure=True, batch=2, seq_len=min(512, config.data.seq_len))
    sections["efficiency"] = report.write_rows(rows, os.path.join(out, "efficiency"),
                                               title=f"Efficiency: {title}")
    quality = _quality(out)
    if quality is not None:
      report.pareto_plot([dict(r, quality=quality) for r in rows], x="mixing_MFLOPs_per_token",
                         y="quality", label="context_len", path=os.path.join(out, "pareto.png"),
                         title=f"quality vs token-mixing MFLOPs per token: {title}")
  return sections


def _quality(out: str):
  """A single quality number for the Pareto plot: mean MQAR or recall accuracy written above."""
  import json
  for name in ("mqar", "recall"):
    path = os.path.join(out, f"{name}.json")
    if os.path.exists(path):
      with open(path) as f:
        rows = json.load(f)
      accs = [r["accuracy"] for r in rows if r["accuracy"] is not None]
      if accs:
        return sum(accs) / len(accs)
  return None


def main(argv=None):
  args = parse_args(argv)
  sections = run(args)
  for md in sections.values():
    print(f"\n{md.strip()}\n")
  print(f"tables and plots in {args.out or os.path.join(args.workdir, 'eval')}")


if __name__ == "__main__":
  sys.exit(main())
