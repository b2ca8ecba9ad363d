"""Converts a checkpoint folder between fla's layout and lineax_lm's.

    python -m lineax_lm.convert --from=fla --path=DIR --out=DIR   # fla folder -> lineax_lm
    python -m lineax_lm.convert --to=fla --path=DIR --out=DIR     # lineax_lm folder or workdir -> fla

The tokenizer files of --path (tokenizer.json, tokenizer_config.json, ...) are copied beside the
weights. Prints the written folder and the model's parameter count.
"""
from __future__ import annotations

from absl import flags

from lineax_lm import cli
from lineax_lm.convert import fla


def define_flags(fv: flags.FlagValues, argv) -> None:
  del argv
  flags.DEFINE_enum("from", None, ["fla"], "--path is a checkpoint in this format; write lineax_lm's "
                    "layout", flag_values=fv)
  flags.DEFINE_enum("to", None, ["fla"], "--path is a lineax_lm folder or training workdir; write "
                    "this format", flag_values=fv)
  flags.DEFINE_string("path", None, "the checkpoint folder to read", flag_values=fv)
  flags.DEFINE_string("out", None, "the folder to write", flag_values=fv)
  flags.mark_flags_as_required(["path", "out"], flag_values=fv)
  flags.mark_flags_as_mutual_exclusive(["from", "to"], required=True, flag_values=fv)


def main(argv=None) -> str:
  a = cli.parse(define_flags, argv, "python -m lineax_lm.convert", __doc__)
  from lineax_lm.models.pretrained import _flat_params, load, save_pretrained
  try:
    if a["from"].value:
      lm = fla.load_fla(a.path)
      out = save_pretrained(lm.model, a.out, tokenizer=lm.tokenizer)
    else:
      lm = load(a.path)
      out = fla.to_fla(lm.model, a.out, tokenizer=lm.tokenizer)
  except (ValueError, FileNotFoundError, FileExistsError) as e:  # each names the file or option
    cli.fail(e)
  copied = fla.copy_tokenizer_files(a.path, out)
  count = sum(v.size for v in _flat_params(lm.model).values())
  print(f"wrote {out} ({count:,} parameters"
        + (f"; tokenizer files: {', '.join(copied)})" if copied else ")"))
  return out


if __name__ == "__main__":
  main()
