"""Configs shipped in the package: `--config quickstart.py:gdn` works without a checkout, and the
repository's configs/quickstart.py is the same config."""
import os

from lineax_lm.configs import packaged, quickstart
from lineax_lm.train.__main__ import load_config_file, with_packaged_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_a_config_name_resolves_to_the_packaged_file(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no checkout here
  want = os.path.join(os.path.dirname(quickstart.__file__), "quickstart.py")
  assert packaged("quickstart") == packaged("configs/quickstart.py") == want
  assert packaged("nope.py") is None and packaged("__init__.py") is None
  assert with_packaged_config(["train", "--config=quickstart.py:gdn", "--workdir", "w"]) == [
      "train", f"--config={want}:gdn", "--workdir", "w"]
  assert with_packaged_config(["train", "--config", "configs/quickstart.py"]) == ["train", "--config", want]
  assert with_packaged_config(["train", "--config=nope.py"]) == ["train", "--config=nope.py"]


def test_the_checkout_config_is_the_packaged_one():
  path = os.path.join(ROOT, "configs", "quickstart.py")
  assert with_packaged_config(["t", f"--config={path}:gdn"]) == ["t", f"--config={path}:gdn"]
  assert load_config_file(path + ":hybrid") == quickstart.get_config("hybrid")
