"""python -m lineax_lm.distill --config configs/distill.py:<student>[,hybrid][,runlocal] --workdir DIR
  [--config.key=value ...]

Runs the distillation stages in order (a finished stage is skipped, an interrupted one resumes from
its checkpoint), then evaluates teacher and student and prints the table (also in DIR/eval.json).
Single host (the stages' mesh spans its devices).
"""
import logging

from absl import app

from lineax_lm import cli
from lineax_lm.train.__main__ import FLAGS, parse_flags  # the same --config / --workdir flags


def main(argv):
  del argv
  logging.getLogger("lineax_lm").setLevel(logging.INFO)
  cli.prepare()
  from lineax_lm.distill.pipeline import distill, format_summary
  summary = distill(FLAGS.config, FLAGS.workdir)
  name = summary["mixer"] + ("" if summary["attn_ratio"] == "pure" else f" ({summary['attn_ratio']})")
  print(format_summary({name: summary}), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
