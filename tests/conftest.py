"""Test setup: 8 fake CPU devices for the sharding tests, GPU tests only where a GPU is."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
  if jax.default_backend() in ("gpu", "cuda"):
    return
  skip = pytest.mark.skip(reason="needs a GPU (marker `gpu`): run on the GPU host")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)
