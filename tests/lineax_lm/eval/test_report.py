"""report.write_atomically: writers of one file at once each rename a whole file of their own."""
import concurrent.futures
import json

from lineax_lm.eval import report


def test_concurrent_writers_of_one_file_each_leave_it_whole(tmp_path):
  path = str(tmp_path / "grid.json")
  payloads = [{"writer": i, "rows": list(range(200))} for i in range(8)]

  def write_many(obj):
    for _ in range(25):
      report.write_json(path, obj)

  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    for future in [pool.submit(write_many, p) for p in payloads]:
      future.result()  # a writer whose temporary file another renamed away would raise here
  assert json.load(open(path)) in payloads
  assert [p.name for p in tmp_path.iterdir()] == ["grid.json"]  # no temporary file left behind
