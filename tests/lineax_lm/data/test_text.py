"""Local text / jsonl sources on files written here; TFDS: a clear error when not prepared."""
import json

import numpy as np
import pytest

from lineax_lm.data.text import JsonlSource, TextFileSource, resolve_paths, tfds_text_source, tokenize
from lineax_lm.data.tokenizer import ByteTokenizer


@pytest.fixture
def corpus(tmp_path):
  (tmp_path / "a.txt").write_text("first line\n\nsecond line é\n", encoding="utf-8")
  (tmp_path / "b.txt").write_text("third\r\nfourth", encoding="utf-8")
  sub = tmp_path / "sub"
  sub.mkdir()
  records = [{"text": "doc zero", "id": 0}, {"text": "doc one ü", "id": 1}, {"text": "doc two"}]
  (sub / "x.jsonl").write_text("\n".join(json.dumps(r) for r in records[:2]) + "\n\n",
                               encoding="utf-8")
  (sub / "y.jsonl").write_text(json.dumps(records[2]) + "\n", encoding="utf-8")
  return tmp_path


def test_text_files_and_lines(corpus):
  files = TextFileSource(f"{corpus}/*.txt", unit="file")
  assert len(files) == 2
  assert files[0] == "first line\n\nsecond line é\n" and files[1] == "third\r\nfourth"
  lines = TextFileSource([str(corpus / "b.txt"), str(corpus / "a.txt")], unit="line")
  assert [lines[i] for i in range(len(lines))] == ["third", "fourth", "first line", "second line é"]
  with pytest.raises(IndexError):
    lines[4]
  with pytest.raises(ValueError, match="text_unit"):
    TextFileSource(str(corpus / "a.txt"), unit="paragraph")


def test_jsonl(corpus):
  src = JsonlSource(f"{corpus}/sub/*.jsonl, {corpus}/sub/x.jsonl")  # a repeat is read once
  assert [src[i] for i in range(len(src))] == ["doc zero", "doc one ü", "doc two"]
  with pytest.raises(ValueError, match="text_field"):
    JsonlSource(f"{corpus}/sub/x.jsonl", text_field="body")[0]
  (corpus / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
  with pytest.raises(ValueError, match="line 2 is not valid JSON"):
    JsonlSource(str(corpus / "bad.jsonl"))[1]


def test_paths_errors(corpus):
  with pytest.raises(FileNotFoundError, match="paths"):
    resolve_paths([f"{corpus}/*.md"])
  with pytest.raises(FileNotFoundError, match="paths"):
    resolve_paths(str(corpus / "missing.txt"))
  with pytest.raises(ValueError, match="paths"):
    resolve_paths(" , ")
  (corpus / "blank.txt").write_text("\n  \n")
  with pytest.raises(ValueError, match="no non-blank line"):
    TextFileSource(str(corpus / "blank.txt"), unit="line")
  assert resolve_paths(f"{corpus}/**/*.jsonl") == [str(corpus / "sub/x.jsonl"),
                                                   str(corpus / "sub/y.jsonl")]


def test_tokenize():
  tok = ByteTokenizer()
  ids = tokenize("hé", tok)
  assert ids.dtype == np.int32
  assert ids.tolist() == [256, 104, 195, 169, 257]
  assert tokenize("hé", tok, add_bos=False, add_eos=False).tolist() == [104, 195, 169]


def test_tfds_missing_dataset_says_how_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"(?s)not prepared.*tfds build mnist "
                                              r"--file_format=array_record --data_dir="):
    tfds_text_source("mnist", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="tfds_name"):
    tfds_text_source("no_such_dataset_xyz", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="tfds_name"):
    tfds_text_source("", data_dir=str(tmp_path))


def test_tfds_prepared_dataset():
  """TFDS's own mock (random records from the dataset's feature spec) stands for prepared data."""
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    src = tfds_text_source("imdb_reviews", split="train", text_field="text")
    assert len(src) == 6 and all(isinstance(src[i], str) for i in range(6))
    with pytest.raises(ValueError, match="text_field"):
      tfds_text_source("imdb_reviews", split="train", text_field="body")[0]


def _gzip(path, data: bytes):
  import gzip
  with gzip.open(path, "wb") as f:
    f.write(data)
  return str(path)


def test_gzip_files_read_as_their_plain_text(corpus):
  for name in ("a.txt", "b.txt", "sub/x.jsonl", "sub/y.jsonl"):
    _gzip(corpus / (name + ".gz"), (corpus / name).read_bytes())
  plain_files, gz_files = (TextFileSource(f"{corpus}/*.txt{s}", unit="file") for s in ("", ".gz"))
  assert [gz_files[i] for i in range(2)] == [plain_files[i] for i in range(2)]
  plain_lines, gz_lines = (TextFileSource(f"{corpus}/*.txt{s}", unit="line") for s in ("", ".gz"))
  assert [gz_lines[i] for i in range(len(gz_lines))] == [plain_lines[i] for i in range(len(plain_lines))]
  src = JsonlSource(f"{corpus}/sub/*.jsonl.gz")   # the blank line of x.jsonl is skipped there too
  assert [src[i] for i in range(len(src))] == ["doc zero", "doc one ü", "doc two"]
  mixed = JsonlSource(f"{corpus}/sub/x.jsonl.gz,{corpus}/sub/y.jsonl")
  assert [mixed[i] for i in range(len(mixed))] == ["doc zero", "doc one ü", "doc two"]


def test_gzip_errors_name_the_file(corpus):
  not_gzip = corpus / "plain.jsonl.gz"
  not_gzip.write_text('{"text": "not compressed"}\n')
  with pytest.raises(ValueError, match=r"plain\.jsonl\.gz: not readable as gzip \(BadGzipFile"):
    JsonlSource(str(not_gzip))
  whole = (corpus / "sub/x.jsonl").read_bytes() * 50
  cut = corpus / "cut.jsonl.gz"
  _gzip(cut, whole)
  cut.write_bytes(cut.read_bytes()[:-12])   # the stream's end and its checksum lost
  with pytest.raises(ValueError, match=r"cut\.jsonl\.gz: not readable as gzip \(EOFError"):
    JsonlSource(str(cut))
  with pytest.raises(ValueError, match=r"cut\.jsonl\.gz: not readable as gzip"):
    TextFileSource(str(cut), unit="file")
  latin1 = _gzip(corpus / "latin1.txt.gz", "line one\nsecond é\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"latin1\.txt\.gz: line 2, byte offset 16: not valid UTF-8"):
    TextFileSource(latin1, unit="line")
  with pytest.raises(ValueError, match=r"latin1\.txt\.gz: line 2, byte offset 16: not valid UTF-8"):
    TextFileSource(latin1, unit="file")
  with pytest.raises(ValueError, match=r"empty\.txt\.gz: the file is empty"):
    TextFileSource(_gzip(corpus / "empty.txt.gz", b""), unit="file")
