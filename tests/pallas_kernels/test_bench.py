"""The op benchmark: a row per op and backend in OUT/ops.json, its tables again from that file with
--report, and one-line errors for a flag it cannot read (an op or backend it does not know, a
malformed shape)."""
import json

import pytest

from pallas_kernels import bench
from pallas_kernels.common import dispatch


def test_every_family_has_its_arguments():
  assert tuple(bench.ARGUMENTS) == dispatch.FAMILIES


def test_rows_are_written_and_reported(tmp_path, capsys):
  argv = ["--ops", "hgrn", "--backends", "reference", "--shapes", "1x64", "--hkv", "1,16,16",
          "--calls", "1", "--reps", "1", "--out", str(tmp_path)]
  bench.main(argv)
  (row,) = json.load(open(tmp_path / "ops.json"))["rows"]
  assert row["op"] == "hgrn" and row["shape"] == "1x64"
  assert row["fwd_ms"] > 0 and row["fwdbwd_ms"] > 0
  capsys.readouterr()
  for where in ("--out", "--fla"):  # the --fla folder holds ops.json when no --out is given
    bench.main(["--report", where, str(tmp_path)])
    assert "| hgrn | 1x64 | reference | 1 | " in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--ops", "nope"], "--ops: unknown op"),
    (["--backends", "cuda"], "--backends: unknown backend"),
    (["--report"], "--report prints the tables of OUT"),
    (["--shapes", "4x4096,8"], r"--shapes: \['8'\] are not BxT"),
    (["--hkv=16,128"], "--hkv: '16,128': give 3 integers"),
    (["--calls", "0"], "flag --calls=0: 0 is not a positive integer"),
    (["--dtype", "bf16"], "--dtype: 'bf16' is not a dtype"),
    (["--segments", "1,all"], r"--segments: \['all'\] are neither counts nor 'auto'")])
def test_bad_flags_say_which(argv, message, monkeypatch):
  monkeypatch.delenv("OUT", raising=False)
  with pytest.raises(SystemExit, match=f"^error: {message}"):
    bench.main(argv)
