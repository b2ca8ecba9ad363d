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

import os
import sys
import types

from absl import flags

from lineax_lm import cli
from lineax_lm.eval import report

RECALL = ("needle", "ruler")


def _positive_ints(text: str) -> list[int]:
  """Comma-separated integers >= 1, at least one; a ValueError saying which is not."""
  values = []
  for item in (x.strip() for x in text.split(",")):
    if not item:
      continue
    try:
      values.append(int(item))
    except ValueError:
      raise ValueError(f"{item!r} is not an integer") from None
    if values[-1] < 1:
      raise ValueError(f"{values[-1]} must be >= 1")
  if not values:
    raise ValueError(f"{text!r} holds no integer (give e.g. 512,1024)")
  return values


class _PositiveIntsParser(flags.ArgumentParser):
  """absl parser of a comma-separated list of integers >= 1."""
  syntactic_help = "comma-separated integers >= 1"

  def parse(self, argument):
    return argument if isinstance(argument, list) else _positive_ints(argument)

  def flag_type(self):
    return "list of int"


def _define_positive_ints(name: str, default: str | None, help: str, flag_values):
  flags.DEFINE(_PositiveIntsParser(), name, default, help, flag_values,
               serializer=flags.ListSerializer(","))


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


def define_flags(fv: flags.FlagValues, argv) -> None:
  del argv
  flags.DEFINE_string("workdir", None, "training run directory (with checkpoints/)", flag_values=fv)
  flags.DEFINE_integer("step", None, "checkpoint step (default: latest)", lower_bound=0,
                       flag_values=fv)
  flags.DEFINE_string("tasks", None, "comma-separated tasks (see above)", flag_values=fv)
  flags.DEFINE_string("out", None, "output folder (default: WORKDIR/eval)", flag_values=fv)
  _define_positive_ints("lengths", "512,1024,2048,4096,8192", "recall context lengths", fv)
  flags.DEFINE_integer("num_examples", 20, "examples per recall task and length", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_enum("mode", "generate", ["generate", "teacher_forced"], "recall scoring",
                    flag_values=fv)
  flags.DEFINE_string("corpus", None, "text files (comma-separated / globs) for haystacks",
                      flag_values=fv)
  flags.DEFINE_string("tokenizer", None, "'byte' or a tokenizer.json (default: the run's)",
                      flag_values=fv)
  _define_positive_ints("mqar_lengths", None, "MQAR lengths (default: the run's seq_len, x2, x4)", fv)
  _define_positive_ints("mqar_kv_pairs", None, "MQAR kv pairs (default: the run's, /2, x2)", fv)
  flags.DEFINE_integer("mqar_examples", 256, "MQAR examples per cell", lower_bound=1, flag_values=fv)
  flags.DEFINE_string("ppl_paths", None, "held-out text files for ppl (the run's format)",
                      flag_values=fv)
  flags.DEFINE_string("ppl_tfds_split", None, "held-out TFDS split for ppl (e.g. validation)",
                      flag_values=fv)
  flags.DEFINE_integer("ppl_documents", 200, "at most this many documents", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("max_len", None, "ppl window (default: the run's seq_len)", lower_bound=1,
                       flag_values=fv)
  _define_positive_ints("efficiency_lengths", "2048,8192,32768", "efficiency context lengths", fv)
  flags.DEFINE_integer("batch_size", 8, "rows per batch", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("seed", 0, "seed of the recall examples", flag_values=fv)
  flags.mark_flag_as_required("workdir", flag_values=fv)
  flags.register_validator("tasks", lambda v: v is None or any(t.strip() for t in v.split(",")),
                           "names no task (give e.g. ppl,needle)", flag_values=fv)


def parse_args(argv=None):
  """The parsed command line (absl flags, lineax_lm.cli); bad input exits with one line naming
  the flag."""
  fv = cli.parse(define_flags, argv, "python -m lineax_lm.eval", __doc__)
  return types.SimpleNamespace(**fv.flag_values_dict())


def select_tasks(args, config) -> tuple[list[str], list[str]]:
  """(every task `--tasks` names, or the default for the run's data; the recall tasks among them),
  checked against what the run can be scored on."""
  from lineax_lm.eval import ruler
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
  return tasks, recall_tasks


def evaluate_mqar(args, model, config, out: str, title: str) -> str:
  """MQAR accuracy over --mqar_lengths x --mqar_kv_pairs (default: around the run's own)."""
  from lineax_lm.eval import mqar
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
  report.line_plot(rows, x="num_kv_pairs", y="accuracy", group="seq_len",
                   path=os.path.join(out, "mqar.png"), title=f"MQAR: {title}", ylim=(0, 1.02))
  return f"## MQAR accuracy: {title} (rows: length)\n\n{mqar.format_grid(rows)}\n"


def evaluate_recall(args, model, tokenizer, tasks: list[str], out: str, title: str) -> str:
  """The RULER-style recall `tasks`, accuracy per context length (--lengths)."""
  from lineax_lm.data.text import resolve_paths
  from lineax_lm.eval import ruler
  if tokenizer is None or tokenizer.vocab_size > model.config.vocab_size:
    raise ValueError("recall tasks need a text tokenizer whose ids fit the model's vocabulary; this "
                     "run has none (MQAR) or a larger one: pass --tokenizer")
  corpus = None
  if args.corpus:
    corpus = [open(f, encoding="utf-8").read() for f in resolve_paths(args.corpus)]
  rows = ruler.evaluate_tasks(model, tokenizer, tasks, args.lengths, args.num_examples,
                              args.seed, args.mode, corpus, args.batch_size, progress=True)
  report.write_rows(rows, os.path.join(out, "recall"), title=f"Recall tasks ({args.mode}): {title}")
  report.line_plot(rows, x="length", y="accuracy", group="task", path=os.path.join(out, "recall.png"),
                   title=f"Recall accuracy ({args.mode}): {title}", logx=True, ylim=(0, 1.02))
  table = report.pivot_table(rows, row="task", col="length", value="accuracy")
  return f"## Recall accuracy ({args.mode}): {title}\n\n{table}\n"


def evaluate_perplexity(args, model, tokenizer, config, out: str, title: str) -> str:
  """Perplexity and bits per byte on held-out text (--ppl_paths or --ppl_tfds_split)."""
  from lineax_lm.eval import language
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
  return report.write_rows([res], os.path.join(out, "ppl"),
                           title=f"Held-out language metrics: {title}")


def evaluate_efficiency(args, model, config, out: str, title: str) -> str:
  """Token-mixing FLOPs, cache bytes and measured forward tokens/s per --efficiency_lengths; the
  Pareto plot against the quality the recall or MQAR task wrote to `out`."""
  from lineax_lm.eval import efficiency
  rows = efficiency.efficiency_rows({title: model}, args.efficiency_lengths,
                                    measure=True, batch=2, seq_len=min(512, config.data.seq_len))
  section = report.write_rows(rows, os.path.join(out, "efficiency"), title=f"Efficiency: {title}")
  quality = _quality(out)
  if quality is not None:
    report.pareto_plot([dict(r, quality=quality) for r in rows], x="mixing_MFLOPs_per_token",
                       y="quality", label="context_len", path=os.path.join(out, "pareto.png"),
                       title=f"quality vs token-mixing MFLOPs per token: {title}")
  return section


def run(args) -> dict:
  """Runs the evaluations of parsed `args`; returns {task: markdown section}."""
  from lineax_lm.eval.loading import data_tokenizer, load_checkpoint, load_config
  config = load_config(args.workdir, args.step)       # the JSON beside the checkpoint: cheap
  tasks, recall_tasks = select_tasks(args, config)
  tokenizer = data_tokenizer(config)
  if args.tokenizer:
    from lineax_lm.data.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(args.tokenizer)
  model, config, step = load_checkpoint(args.workdir, args.step)
  out = args.out or os.path.join(args.workdir, "eval")
  os.makedirs(out, exist_ok=True)
  title = f"{os.path.basename(os.path.abspath(args.workdir))} (step {step})"
  sections = {}
  if "mqar" in tasks:
    sections["mqar"] = evaluate_mqar(args, model, config, out, title)
  if recall_tasks:
    sections["recall"] = evaluate_recall(args, model, tokenizer, recall_tasks, out, title)
  if "ppl" in tasks:
    sections["ppl"] = evaluate_perplexity(args, model, tokenizer, config, out, title)
  if "efficiency" in tasks:  # last: its Pareto plot reads the quality the tasks above wrote
    sections["efficiency"] = evaluate_efficiency(args, model, config, out, title)
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
  from lineax_lm.train.checkpoint import CheckpointError
  try:
    sections = run(args)
  except (ValueError, FileNotFoundError, CheckpointError) as e:  # bad input: one line, no traceback
    cli.fail(e)
  for md in sections.values():
    print(f"\n{md.strip()}\n")
  print(f"tables and plots in {args.out or os.path.join(args.workdir, 'eval')}")


if __name__ == "__main__":
  sys.exit(main())
