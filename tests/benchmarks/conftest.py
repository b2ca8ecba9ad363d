import importlib
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "benchmarks")


@pytest.fixture
def import_benchmark(monkeypatch):
  """import_benchmark("generation"): a script of benchmarks/, imported by its bare name as it
  imports its sibling modules."""
  monkeypatch.syspath_prepend(BENCHMARKS)
  return importlib.import_module
