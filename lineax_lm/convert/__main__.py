"""Converts a checkpoint folder between fla's layout and lineax_lm's.

    python -m lineax_lm.convert --from fla DIR --out DIR   # fla folder -> lineax_lm (save_pretrained)
    python -m lineax_lm.convert --to fla DIR --out DIR     # lineax_lm folder or workdir -> fla

The tokenizer files of DIR (tokenizer.json, tokenizer_config.json, ...) are copied beside the
weights. Prints the written folder and the model's parameter count.
"""
from __future__ import annotations

import argparse

from lineax_lm.convert import fla


def main(argv=None) -> str:
  parser = argparse.ArgumentParser(prog="python -m lineax_lm.convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  direction = parser.add_mutually_exclusive_group(required=True)
  direction.add_argument("--from", dest="source_format", choices=["fla"],
                         help="DIR is a checkpoint in this format; write lineax_lm's layout")
  direction.add_argument("--to", dest="target_format", choices=["fla"],
                         help="DIR is a lineax_lm folder or training workdir; write this format")
  parser.add_argument("dir", help="the checkpoint folder to read")
  parser.add_argument("--out", required=True, help="the folder to write")
  args = parser.parse_args(argv)

  from lineax_lm.models.pretrained import _flat_params, load, save_pretrained
  if args.source_format:
    lm = fla.load_fla(args.dir)
    out = save_pretrained(lm.model, args.out, tokenizer=lm.tokenizer)
  else:
    lm = load(args.dir)
    out = fla.to_fla(lm.model, args.out, tokenizer=lm.tokenizer)
  copied = fla.copy_tokenizer_files(args.dir, out)
  count = sum(v.size for v in _flat_params(lm.model).values())
  print(f"wrote {out} ({count:,} parameters"
        + (f"; tokenizer files: {', '.join(copied)})" if copied else ")"))
  return out


if __name__ == "__main__":
  main()
