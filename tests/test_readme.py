"""The README's Python examples run as written: every ```python block, each in a fresh namespace
and an empty working folder, except a block right after a `<!-- readme-test: skip (why) -->`
line (a download or a GPU), which must say why."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "README.md")
BLOCK = re.compile(r"(?:^<!-- readme-test: skip \((?P<why>[^)]+)\) -->\n)?^```python\n(?P<code>.*?)^```",
                   re.M | re.S)


def blocks() -> list:
  with open(README, encoding="utf-8") as f:
    found = [(m.group("why"), m.group("code")) for m in BLOCK.finditer(f.read())]
  assert found, "README.md holds no ```python block"
  return found


def test_every_skipped_block_says_why():
  with open(README, encoding="utf-8") as f:
    text = f.read()
  markers = sum(line.startswith("<!-- readme-test: skip") for line in text.splitlines())
  assert markers == sum(why is not None for why, _ in blocks())


@pytest.mark.slow  # compiles a chunk op and a tiny model's generation: 15-50 s on 2 CPU cores
@pytest.mark.parametrize("index", [i for i, (why, _) in enumerate(blocks()) if why is None])
def test_readme_python_block_runs(index, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _, code = blocks()[index]
  exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
