"""The command-line convention (lineax_lm.cli): one-line errors, and the CPU as the platform where
libtpu is installed without a TPU (no start-up wait for a TPU that is not there)."""
import importlib.util
import os
import subprocess
import sys

import pytest
from absl import flags

from lineax_lm import cli


def _define(fv, argv):
  del argv
  flags.DEFINE_integer("steps", 1, "steps", lower_bound=1, flag_values=fv)


@pytest.mark.parametrize("argv, says", [(["--steps=0"], "steps"), (["--stpes=2"], "stpes"),
                                         (["a b"], "unexpected argument")])
def test_bad_input_is_one_line_naming_it(argv, says):
  with pytest.raises(SystemExit, match=says):
    cli.parse(_define, argv, "prog", "doc")


@pytest.mark.skipif(not importlib.util.find_spec("libtpu") or cli.accelerator_present(),
                    reason="needs libtpu installed and no TPU or CUDA plugin")
@pytest.mark.parametrize("given, want", [(None, "cpu"), ("cpu,tpu", "cpu,tpu")])
def test_libtpu_without_a_tpu_runs_on_the_cpu_unless_told_otherwise(given, want):
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  if given:
    env["JAX_PLATFORMS"] = given
  code = ("from lineax_lm import cli; cli.cpu_without_accelerator(); import jax, os; "
          "print(jax.config.jax_platforms, os.environ['JAX_PLATFORMS'])")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True).stdout.split()
  assert out == [want, want]
