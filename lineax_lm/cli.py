"""The command-line convention of lineax_lm's commands: absl flags, with ml_collections'
`--config.field=value` overrides where a command takes a config; bad input (a missing required
flag, a value of the wrong type or range, an unknown flag, a leftover argument) exits with one line
naming the flag; Orbax's and absl's INFO logs stay out of the terminal.

Each command builds its flags in a `flags.FlagValues` of its own on every call, so a command's
main(argv) can be called twice in one process (tests, notebooks) and two commands never share flags.
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import sys
from typing import Callable, Sequence

from absl import flags


def parse(define: Callable[[flags.FlagValues, list[str]], None], argv: Sequence[str] | None,
          prog: str, doc: str) -> flags.FlagValues:
  """The flags `define(flag_values, full_argv)` declares, parsed from `argv` (the arguments after
  the program name; None: sys.argv's). --help prints `doc` and the flags."""
  argv = [prog, *(sys.argv[1:] if argv is None else argv)]
  flag_values = flags.FlagValues()
  try:
    define(flag_values, argv)  # a config flag reads its --config.<field> overrides here
    if any(a in ("--help", "-h", "--helpfull") for a in argv[1:]):
      print(f"{doc.strip()}\n\nflags:\n{flag_values.get_help()}")
      sys.exit(0)
    rest = flag_values(argv)
  except flags.Error as e:
    sys.exit(f"error: {flag_error_line(e)}")
  except (AttributeError, KeyError) as e:  # config_flags: an override of a field the config lacks
    overrides = [a.split("=", 1)[0] for a in argv if a.startswith("--config.")]
    sys.exit(f"error: {' or '.join(overrides)}: the config has no field {str(e).strip(chr(34))}")
  if len(rest) > 1:  # absl passes on what is not a flag: an unquoted value with a space, say
    sys.exit(f"error: unexpected argument(s) {rest[1:]}: every argument is a --flag (quote a value "
             "that holds spaces or a glob the shell would expand: --paths='data/*.txt')")
  prepare()
  return flag_values


def flag_error_line(error: Exception) -> str:
  """An absl flag error in one line: config_flags reports a config file's own exception with the
  whole traceback in the message, of which the last line (the exception) says what is wrong."""
  message = str(error).strip()
  if "Error whilst parsing config file" in message:
    flag = message.split(": Error whilst parsing config file")[0]
    return f"{flag}: {message.splitlines()[-1]}"
  return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def parse_absl_flags(argv: Sequence[str]) -> list[str]:
  """A `flags_parser` for absl.app.run over the global FLAGS, with one-line errors."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f"error: {flag_error_line(e)}")


def prepare() -> None:
  """What every command does once its flags are parsed, before it touches a device."""
  quiet_library_logs()
  cpu_without_accelerator()


def cpu_without_accelerator() -> None:
  """Makes the CPU jax's platform where libtpu is installed (the `tpu_aot` extra compiles for TPUs
  that are not here) but no TPU device node and no CUDA plugin exists: jax would otherwise look
  for a TPU at start-up, ~20 s of metadata-server timeouts and a warning, on every command. An
  explicit JAX_PLATFORMS (or jax_platforms) wins; child processes inherit the choice. Call before
  anything touches a backend."""
  import jax
  if jax.config.jax_platforms or not importlib.util.find_spec("libtpu"):
    return
  if not accelerator_present():
    jax.config.update("jax_platforms", "cpu")
    os.environ["JAX_PLATFORMS"] = "cpu"


def accelerator_present() -> bool:
  """A TPU device node (/dev/accel* on v4, /dev/vfio/N from v5) or a CUDA plugin for jax."""
  tpu_nodes = glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*")
  return bool(tpu_nodes) or any(importlib.util.find_spec(m)
                                for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


def quiet_library_logs() -> None:
  """Orbax logs every save and restore at INFO through absl's logger: warnings and errors only
  (the "absl" logger alone: under absl.app, absl's verbosity would set the root logger's level
  and hide lineax_lm's own INFO lines with them)."""
  logging.getLogger("absl").setLevel(logging.WARNING)


def fail(error: Exception | str) -> None:
  """Exits with `error` as one line (a bad value found after parsing, e.g. a task name)."""
  sys.exit(f"error: {error}")
