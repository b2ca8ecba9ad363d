"""Training configs shipped with the package (importable from a wheel, no repository checkout):
`lineax_lm.configs.quickstart.get_config("gdn")`, or on the command line
`python -m lineax_lm.train --config quickstart.py:gdn` (a --config that names no file is looked up
here; `configs/quickstart.py` in the repository is the same config)."""
import os

FOLDER = os.path.dirname(os.path.abspath(__file__))


def packaged(name: str) -> str | None:
  """The path of packaged config `name` ("quickstart", "quickstart.py" or "configs/quickstart.py"),
  or None when the package has no such config."""
  base = os.path.basename(name)
  base = base if base.endswith(".py") else base + ".py"
  path = os.path.join(FOLDER, base)
  return path if base != "__init__.py" and os.path.isfile(path) else None
