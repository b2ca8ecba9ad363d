"""Test setup: 8 fake CPU devices for the sharding tests, GPU tests only where a GPU is."""
import os

# 8 fake CPU devices for the sharding tests; LLVM optimisation off halves the compile time that
# dominates the suite on CPU (the tests' programs are small; numerics are unchanged).
_flags = os.environ.get("XLA_FLAGS", "")
for _flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
  if _flag.split("=")[0] not in _flags:
    _flags += " " + _flag
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  if jax.default_backend() in ("gpu", "cuda"):
    return
  skip = pytest.mark.skip(reason="needs a GPU (marker `gpu`): run on the GPU host")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
