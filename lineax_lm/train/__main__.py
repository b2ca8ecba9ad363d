"""python -m lineax_lm.train --config configs/X.py [--config.key=value ...] --workdir DIR

Restarting with the same workdir resumes from its latest checkpoint. Configs are locked: an override
of a field that does not exist fails with the closest field names.
"""
import difflib
import importlib.util
import logging
import os
import re
import sys

from absl import app, flags
from ml_collections import config_flags

from lineax_lm.train.trainer import train_and_evaluate

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, TensorBoard events and metrics.jsonl go.")
flags.mark_flags_as_required(["config", "workdir"])


def config_keys(config, prefix="") -> list[str]:
  keys = []
  for name, value in config.items():
    keys.append(prefix + name)
    if hasattr(value, "items"):
      keys += config_keys(value, prefix + name + ".")
  return keys


def load_config_file(path: str):
  spec = importlib.util.spec_from_file_location("config_file", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def parse_flags(argv):
  """absl flag parsing, with suggestions for a mistyped --config.<field> override."""
  try:
    return FLAGS(argv)
  except (AttributeError, KeyError, flags.Error) as e:
    overrides = [m.group(1) for a in argv if (m := re.match(r"--config\.([\w.]+)", a))]
    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None and "--config" in argv[:-1]:
      path = argv[argv.index("--config") + 1]
    known = config_keys(load_config_file(path)) if path else []
    bad = [o for o in overrides if o not in known]
    if not bad:
      raise
    hints = "; ".join(f"--config.{o}: did you mean "
                      f"{' or '.join('--config.' + k for k in difflib.get_close_matches(o, known, 3, 0.6)) or 'nothing close'}?"
                      for o in bad)
    sys.exit(f"error: unknown config field(s) ({e}). {hints}")


def main(argv):
  del argv
  import jax
  # Multi-host: initialise when a cluster environment asks for it (TPU pods, SLURM, ...).
  if any(v in os.environ for v in ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
                                   "MEGASCALE_COORDINATOR_ADDRESS")):
    jax.distributed.initialize()
  logging.getLogger("lineax_lm").setLevel(logging.INFO)
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
