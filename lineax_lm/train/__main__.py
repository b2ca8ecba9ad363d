"""python -m lineax_lm.train --config configs/X.py [--config.key=value ...] --workdir DIR

DIR may be local or gs://... (etils.epath). On a cluster (TPU slice, SLURM tasks, or the
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables) every process runs the same
command; they join through jax.distributed (lineax_lm.train.distributed).

Restarting with the same workdir resumes from its latest checkpoint. Configs are locked: an override
of a field that does not exist fails with the closest field names.
"""
import difflib
import importlib.util
import os
import re
import sys

from absl import app, flags
from ml_collections import config_flags

from lineax_lm import cli
from lineax_lm.train import distributed
from lineax_lm.train.trainer import train_and_evaluate
from lineax_lm.train.validation import check_config

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py, or the name of one "
                                "shipped in lineax_lm/configs: quickstart.py:gdn).", lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, TensorBoard events and metrics.jsonl go.")
flags.DEFINE_string("aot", None, "A TPU topology (v5p:4x4x4, v5e-8): compile the step for that slice "
                    "with libtpu, print its HBM per chip, FLOPs and a roofline estimate, and exit "
                    "(lineax_lm.train.aot); nothing runs and no --workdir is needed.")
flags.mark_flags_as_required(["config"])
flags.register_validator("workdir", lambda w: w is not None or FLAGS["aot"].value is not None,
                         "--workdir is required (or --aot=TOPOLOGY to only compile the step)")


def config_keys(config, prefix="") -> list[str]:
  keys = []
  for name, value in config.items():
    keys.append(prefix + name)
    if hasattr(value, "items"):
      keys += config_keys(value, prefix + name + ".")
  return keys


def load_config_file(value: str):
  """The config a --config value names, in both forms the flag takes (as ml_collections reads
  them): "file.py" -> get_config(), "file.py:arg" -> get_config("arg")."""
  path, colon, arg = value.partition(":")
  spec = importlib.util.spec_from_file_location("config_file", path)
  if spec is None:
    raise FileNotFoundError(f"--config: cannot load {path!r} as a Python file")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if colon else module.get_config()


def _config_path(argv) -> str | None:
  """The value of --config (as "--config=VALUE" or "--config VALUE"), or None."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def unknown_field_hints(argv) -> str | None:
  """"--config.x: did you mean ...?" for each --config.<field> override of `argv` that the config
  lacks; None when there is none, or when the config itself does not load (its own error is then
  the one to show)."""
  overrides = [m.group(1) for a in argv if (m := re.match(r"--config\.([\w.]+)", a))]
  path = _config_path(argv)
  if not overrides or path is None:
    return None
  try:
    known = config_keys(load_config_file(path))
  except Exception:  # the config's own error is the one FLAGS raised: shown instead of hints
    return None
  bad = [o for o in overrides if o not in known]
  if not bad:
    return None
  def hint(field):
    close = " or ".join("--config." + k for k in difflib.get_close_matches(field, known, 3, 0.6))
    return f"--config.{field}: did you mean {close or 'nothing close'}?"
  return "; ".join(hint(o) for o in bad)


def with_packaged_config(argv) -> list[str]:
  """`argv` with a --config that names no file ("quickstart.py:gdn", or "configs/quickstart.py:gdn"
  outside a checkout) pointed at the config of that name shipped in lineax_lm.configs."""
  from lineax_lm.configs import packaged
  out = list(argv)
  for i, a in enumerate(out):
    if a.startswith("--config="):
      j, value = i, a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(out):
      j, value = i + 1, out[i + 1]
    else:
      continue
    path, colon, arg = value.partition(":")
    found = None if os.path.isfile(path) else packaged(path)
    if found:
      out[j] = ("--config=" if j == i else "") + found + colon + arg
    break
  return out


def parse_flags(argv):
  """absl flag parsing, with suggestions for a mistyped --config.<field> override; a flag error (a
  missing required flag, a value of the wrong type) or a config file that refuses its argument is
  one line. A --config naming a config shipped in the package is found without a checkout."""
  argv = with_packaged_config(argv)
  path = _config_path(argv)
  if path is not None and not os.path.isfile(path.partition(":")[0]):
    sys.exit(f"error: --config={path}: no such file (give a config file, e.g. configs/quickstart.py:gdn, "
             "or the name of one shipped in lineax_lm/configs)")
  try:
    return FLAGS(argv)
  except (AttributeError, KeyError, flags.Error) as e:
    hints = unknown_field_hints(argv)
    if hints is not None:
      sys.exit(f"error: unknown config field(s): {hints}")
    if isinstance(e, flags.Error):  # a missing flag, a bad value, a config file that refused its argument
      sys.exit(f"error: {cli.flag_error_line(e)}")
    raise


def main(argv):
  cli.prepare()
  if len(argv) > 1:  # absl passes on what is not a flag: an unquoted path with a space, say
    sys.exit(f"error: unexpected argument(s) {argv[1:]}: every argument is a --flag (quote a value "
             "that holds spaces, e.g. --workdir='runs/my run')")
  if FLAGS.aot:
    from lineax_lm.train import aot
    sys.exit(aot.main(FLAGS.config, FLAGS.aot))
  # Multi-host: join the cluster the environment describes (TPU slice, SLURM, or the JAX_*
  # variables) before anything touches a device; INFO logs from process 0 only.
  try:
    distributed.initialize()
  except ValueError as e:
    sys.exit(f"error: {e}")
  try:
    check_config(FLAGS.config)  # before the mesh is built: `mesh.fsdp=0` would divide by zero there
  except ValueError as e:
    sys.exit(f"error: {e}")
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
