"""lm-eval's own command line, with the lineax model registered:

    python -m lineax_lm.eval.lm_eval --model lineax --model_args path=runs/x --tasks lambada_openai

Every lm-eval flag works as with `lm_eval` (`--limit`, `--include_path`, `--output_path`,
`--batch_size`, subcommands such as `ls tasks`); `path` is a training run or a `save_pretrained`
folder, and the other model_args are lineax_lm.eval.lm_eval_adapter's (step, tokenizer,
max_length, max_gen_toks). lm-eval 0.4.x does not read the `lm_eval.models` entry point the
package declares, so `lm_eval --model lineax` alone finds no model of that name; this module
imports the adapter (which registers "lineax") before handing the command line to lm-eval.
"""
from __future__ import annotations

import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> None:
  """Runs lm-eval's CLI on `argv` (its arguments; None: this process's command line)."""
  from lineax_lm.eval import lm_eval_adapter
  if lm_eval_adapter._register is None:
    sys.exit("error: lm-eval is not installed: pip install 'lineax-lm[eval]'")
  from lm_eval.__main__ import cli_evaluate
  saved = sys.argv
  sys.argv = ["lm_eval", *(saved[1:] if argv is None else argv)]  # lm-eval's CLI reads sys.argv
  try:
    _check_model_path(sys.argv[1:])
    cli_evaluate()
  except (ValueError, FileNotFoundError) as e:  # a bad model_args path, an unknown task: one line
    sys.exit(f"error: {e}")
  finally:
    sys.argv = saved


def _check_model_path(argv: Sequence[str]) -> None:
  """A FileNotFoundError now for a `--model lineax` path that holds no model, not after lm-eval
  has indexed its task folders (about 20 s)."""
  import argparse

  from lineax_lm.eval.lm_eval_adapter import LineaxLM
  from lineax_lm.models.pretrained import folder_kind
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument("--model")
  parser.add_argument("--model_args", default="")
  known, _ = parser.parse_known_args(argv)
  if known.model == "lineax":
    args = LineaxLM.parse_model_args(known.model_args)
    path = args.get("path", args.get("workdir"))
    if path is not None:
      folder_kind(path)


if __name__ == "__main__":
  main()
