"""python -m lineax_lm.train --config configs/X.py [--config.key=value ...] --workdir DIR

Restarting with the same workdir resumes from its latest checkpoint.
"""
import logging
import os

from absl import app, flags
from ml_collections import config_flags

from lineax_lm.train.trainer import train_and_evaluate

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, TensorBoard events and metrics.jsonl go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  import jax
  # Multi-host: initialise when a cluster environment asks for it (TPU pods, SLURM, ...).
  if any(v in os.environ for v in ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES", "SLURM_NTASKS",
                                   "MEGASCALE_COORDINATOR_ADDRESS")):
    jax.distributed.initialize()
  logging.getLogger("lineax_lm").setLevel(logging.INFO)
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
