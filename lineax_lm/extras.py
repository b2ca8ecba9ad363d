"""Optional dependencies: what only plotting, TFDS data or distillation needs lives in an extra of
the package (`pip install 'lineax-lm[plot]'`, `[tfds]`, `[distill]`, `[eval]`); `require` imports it
or says which extra brings it."""
from __future__ import annotations

import importlib
import importlib.util

# module -> (pip distribution, extra)
OPTIONAL = {
    "matplotlib": ("matplotlib", "plot"),
    "tensorflow_datasets": ("tensorflow-datasets", "tfds"),
    "gguf": ("gguf", "distill"),
    "lm_eval": ("lm-eval", "eval"),
}


def require(module: str, purpose: str):
  """The imported `module`, or an ImportError naming the extra to install for `purpose`."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    dist, extra = OPTIONAL[module.split(".")[0]]
    raise ImportError(f"{purpose} needs {dist}, which is not installed: pip install "
                      f"'lineax-lm[{extra}]' (or pip install {dist})") from e


def available(module: str) -> bool:
  return importlib.util.find_spec(module) is not None
