"""benchmarks/ab.sh: an earlier tree's op rows (a git revision archived, or a folder) beside this
tree's, from one call, with the table of baseline/ours ratios; a BASE that is neither fails saying
so."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAGS = ["--ops", "hgrn", "--backends", "reference", "--shapes", "1x64", "--hkv", "1,16,16",
         "--calls", "1", "--reps", "1"]


def run(tmp_path, *args):
  env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
  return subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "ab.sh"), *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)


def test_a_revision_is_timed_beside_this_tree(tmp_path):
  done = run(tmp_path, "HEAD", *FLAGS)
  assert done.returncode == 0, done.stdout + done.stderr
  for tree in ("base", "this"):
    assert os.path.exists(tmp_path / tree / "ops.json")
  assert "| hgrn | 1x64 | reference | 1 | " in (tmp_path / "ab.md").read_text()
  assert "baseline/ours fwd+bwd" in done.stdout


def test_a_base_that_is_no_revision_says_so(tmp_path):
  done = run(tmp_path, "no-such-revision", *FLAGS)
  assert done.returncode == 2
  assert ("BASE no-such-revision: neither a folder with benchmarks/ops.py nor a git revision"
          in done.stdout)
