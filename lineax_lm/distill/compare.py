"""Distil one teacher into several students with the same budget and print their evaluation side by
side (the entry point of launch/distill_h200.sh).

    python -m lineax_lm.distill.compare --workdir runs/distill_h200 --mixers gated_deltanet,gla \\
        [--teacher PATH.gguf] [--steps 300,300,600] [--batch 16] [--seq_len 512] [--docs 2048] \\
        [--dtype bfloat16] [--packing concat] [--text_paths FILES] [--hybrid] [--runlocal]

Every student gets the same teacher samples (generated once into <workdir>/data), the same stage
steps, batch and sequence length; each runs in <workdir>/<mixer> with lineax_lm.distill.pipeline
(resumable: rerun the same command to continue). Prints a markdown table (teacher first) and writes
it with the summaries to <workdir>/compare.json.
"""
from __future__ import annotations

import argparse
import logging
import os
import time

from lineax_lm.distill.config import distill_config
from lineax_lm.distill.pipeline import distill, format_summary
from lineax_lm.eval import report


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--mixers", default="gated_deltanet,gla", help="comma-separated student mixers")
  p.add_argument("--teacher", default="", help="GGUF file or HF directory ('' = the shipped SmolLM2)")
  p.add_argument("--steps", default="", help="steps of the layer,block,e2e stages ('' = the config's)")
  p.add_argument("--batch", type=int, default=0, help="rows per step (0 = the config's)")
  p.add_argument("--seq_len", type=int, default=0, help="tokens per row (0 = the config's)")
  p.add_argument("--docs", type=int, default=0, help="teacher samples to train on (0 = the config's)")
  p.add_argument("--sample_batch", type=int, default=0, help="sequences sampled at once (0 = config)")
  p.add_argument("--dtype", default="", help="activation dtype, e.g. bfloat16 ('' = the config's)")
  p.add_argument("--packing", default="", help="concat | first_fit | none ('' = the config's)")
  p.add_argument("--text_paths", default="", help="real held-out text files for a second perplexity")
  p.add_argument("--profile_steps", type=int, default=0,
                 help="trace this many steps of every stage (after 10) and log where the time goes")
  p.add_argument("--hybrid", action="store_true", help="3:1 hybrid students")
  p.add_argument("--runlocal", action="store_true", help="tiny random teacher, seconds on CPU")
  return p.parse_args(argv)


def student_config(args, mixer: str):
  switches = ",".join(s for s, on in (("hybrid", args.hybrid), ("runlocal", args.runlocal)) if on)
  c = distill_config(mixer, switches)
  c.teacher.path = args.teacher
  c.samples.dir = os.path.join(args.workdir, "data")
  if args.steps:
    steps = [int(s) for s in args.steps.split(",")]
    if len(steps) != 3:
      raise ValueError(f"--steps: give three numbers (layer,block,e2e); got {args.steps!r}")
    for stage, n in zip(("layer", "block", "e2e"), steps):
      c.stages[stage].steps = n
  for value, section, key in ((args.batch, c.data, "global_batch_size"), (args.seq_len, c.data, "seq_len"),
                              (args.docs, c.samples, "num_docs"), (args.sample_batch, c.samples, "batch_size"),
                              (args.dtype, c.model, "dtype"), (args.packing, c.data, "packing"),
                              (args.text_paths, c.eval, "text_paths"),
                              (args.profile_steps, c.train, "profile_steps")):
    if value:
      section[key] = value
  return c


def main(argv=None) -> dict:
  args = parse_args(argv)
  logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
  logging.getLogger("lineax_lm").setLevel(logging.INFO)
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save INFO lines
  summaries, seconds = {}, {}
  for mixer in [m.strip() for m in args.mixers.split(",") if m.strip()]:
    start = time.perf_counter()
    summary = distill(student_config(args, mixer), os.path.join(args.workdir, mixer))
    name = mixer + ("" if summary["attn_ratio"] == "pure" else f" ({summary['attn_ratio']})")
    summaries[name], seconds[name] = summary, time.perf_counter() - start
    print(f"{name}: {seconds[name]:.0f} s (this invocation)", flush=True)
  table = format_summary(summaries)
  print(table, flush=True)
  report.write_json(os.path.join(args.workdir, "compare.json"),
                    {"table": table, "seconds": seconds, "summaries": summaries})
  return summaries


if __name__ == "__main__":
  main()
