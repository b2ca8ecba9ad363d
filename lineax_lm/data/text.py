"""Text sources (grain random-access data sources of documents as `str`) and tokenization.

- `TextFileSource(paths, unit="file" | "line")`: text files (local or gs://..., through etils.epath); a document is a whole file or one
  non-empty line.
- `JsonlSource(paths, text_field="text")`: JSON-lines files (local or gs://...); a document is the `text_field` of
  one line's object.
  Both read gzip files (a name ending in `.gz`: `train-00000.jsonl.gz`, `notes.txt.gz`) through
  `open_data_file`; a file named `.gz` that is not valid gzip (or is truncated) is a ValueError
  naming the file.
- `ParquetSource(paths, text_field="text")`: Parquet files (local or gs://..., read with pyarrow);
  a document is the `text_field` of one row (fineweb-edu's shards have a "text" column).
- `tfds_text_source(name, split=..., data_dir=..., text_field=...)`: a TFDS dataset already prepared
  in a random-access format (array_record) on local disk, read through `tfds.data_source`; never
  downloads, and a dataset that is not there raises a FileNotFoundError saying how to prepare it.
- `tokenize(text, tokenizer, add_bos, add_eos)`: a document -> [n] int32 ids.

`paths` is a list of files or glob patterns, or one string of them separated by commas; every
pattern must match a file. Files are indexed once (byte offsets of their lines), then read lazily, so
random access costs one seek; sources are thread-safe (each read opens its file). A gzip file of
unit "line" / jsonl is decompressed once into memory instead (seeking in a gzip stream re-reads it
from the start, which a shuffled read order would do for every document): fine up to some hundred
MB of text (the shipped corpus holds 6.3 MB); keep a larger corpus as plain jsonl, parquet or
array_record.
Building a source checks every file once: an empty file (unit "file") or one that is not UTF-8 is a
ValueError that names the file, the line and the byte offset (of the decompressed bytes for gzip),
before any training step. A UTF-8 byte-order mark opening a file is not text: no document holds it,
and a file of nothing else is empty.
"""
from __future__ import annotations

import bisect
import codecs
import contextlib
import functools
import gzip
import json
import os
import zlib
from typing import Sequence

import numpy as np

from lineax_lm import storage
from lineax_lm.extras import require
from lineax_lm.data.tokenizer import Tokenizer


def resolve_paths(paths: str | Sequence[str]) -> list[str]:
  """Files or globs (a list, or one comma-separated string) -> the sorted files each one matches,
  in the order given, without repeats."""
  if isinstance(paths, str):
    paths = [p.strip() for p in paths.split(",") if p.strip()]
  if not paths:
    raise ValueError("`paths` is empty: give the text / jsonl files (or glob patterns) to read")
  files: list[str] = []
  for pattern in paths:
    pattern = os.fspath(pattern)
    pattern = pattern if storage.is_remote(pattern) else os.path.expanduser(pattern)
    if storage.has_magic(pattern):
      matches = storage.glob_files(pattern)
    else:
      matches = [pattern] if storage.is_file(pattern) else []
    if not matches:
      raise FileNotFoundError(f"`paths`: {pattern!r} matches no file")
    files.extend(m for m in matches if m not in files)
  return files


GZIP_SUFFIX = ".gz"


def is_gzip(path) -> bool:
  """A file read through gzip: its name ends in `.gz` (`x.jsonl.gz`, `x.txt.gz`)."""
  return os.fspath(path).endswith(GZIP_SUFFIX)


@contextlib.contextmanager
def open_data_file(path):
  """A binary stream of the bytes of a text / jsonl file: decompressed when `is_gzip(path)`. Bad
  gzip data (not gzip, corrupt, truncated) is a ValueError naming the file."""
  with storage.open_file(path, "rb") as raw:
    if not is_gzip(path):
      yield raw
      return
    try:
      with gzip.GzipFile(fileobj=raw, mode="rb") as f:
        yield f
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
      raise ValueError(f"{path}: not readable as gzip ({type(e).__name__}: {e}); a file whose name "
                       f"ends in {GZIP_SUFFIX!r} is read as gzip (recompress it, or rename it if it "
                       "is plain text)") from None


def _not_utf8(path: str, line_no: int, offset: int, e: UnicodeDecodeError) -> ValueError:
  """The error for bytes that are not UTF-8: line `line_no` (1-based) and file byte `offset`."""
  return ValueError(f"{path}: line {line_no}, byte offset {offset}: not valid UTF-8 ({e.reason}: "
                    f"{e.object[e.start:e.end]!r}); text data must be UTF-8 (convert the file, "
                    "e.g. with iconv)")


def _decode(data: bytes, path: str, first_line: int, offset: int) -> str:
  """`data` (read from `path` at byte `offset`, where line `first_line` starts) as UTF-8."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _not_utf8(path, first_line + data.count(b"\n", 0, e.start), offset + e.start, e) from None


def _index_lines(path: str) -> tuple[np.ndarray, bytes | None]:
  """Byte offsets of the non-blank lines of a file, [n] int64 (every line checked as UTF-8), and
  for a gzip file its decompressed bytes, which the offsets index (None for a plain file: its
  lines are read back by seeking)."""
  offsets, pos, lines = [], 0, [] if is_gzip(path) else None
  with open_data_file(path) as f:
    for line_no, line in enumerate(f, 1):
      _decode(line, path, line_no, pos)
      start = len(codecs.BOM_UTF8) if pos == 0 and line.startswith(codecs.BOM_UTF8) else 0
      if line[start:].strip():
        offsets.append(pos + start)
      pos += len(line)
      if lines is not None:
        lines.append(line)
  return np.asarray(offsets, np.int64), None if lines is None else b"".join(lines)


def _check_text_file(path: str, block: int = 1 << 20) -> None:
  """ValueError unless `path` holds some bytes (decompressed, for gzip), all of them UTF-8 (read
  in blocks of `block`)."""
  decoder, line_no, pos, head = codecs.getincrementaldecoder("utf-8")(), 1, 0, b""
  with open_data_file(path) as f:
    while True:
      data = f.read(block)
      head += data[:len(codecs.BOM_UTF8) - len(head)]
      try:
        decoder.decode(data, final=not data)
      except UnicodeDecodeError as e:  # e.start counts from the bytes the decoder still held
        start = pos - (len(e.object) - len(data))
        raise _not_utf8(path, line_no + e.object.count(b"\n", 0, e.start), start + e.start,
                        e) from None
      if not data:
        break
      line_no, pos = line_no + data.count(b"\n"), pos + len(data)
  if pos == 0:
    raise ValueError(f"{path}: the file is empty; a document needs text (remove it from `paths`)")
  if pos == len(codecs.BOM_UTF8) and head == codecs.BOM_UTF8:
    raise ValueError(f"{path}: the file holds only a UTF-8 byte-order mark, no text; a document "
                     "needs text (remove it from `paths`)")


def _read_line(path: str, offset: int, decompressed: bytes | None) -> str:
  """The line at byte `offset` of `path`, or of its `decompressed` bytes when given."""
  if decompressed is not None:
    end = decompressed.find(b"\n", offset)
    return decompressed[offset:len(decompressed) if end < 0 else end + 1].decode("utf-8")
  with storage.open_file(path, "rb") as f:
    f.seek(offset)
    return f.readline().decode("utf-8")


class _LinesSource:
  """Random access to the non-blank lines of several files (line i of the concatenation)."""

  def __init__(self, paths: str | Sequence[str]):
    self.files = resolve_paths(paths)
    self._offsets, self._decompressed = zip(*(_index_lines(f) for f in self.files))
    self._starts = np.cumsum([0] + [len(o) for o in self._offsets]).tolist()
    if self._starts[-1] == 0:
      raise ValueError(f"`paths`: the files {self.files} hold no non-blank line")

  def __len__(self) -> int:
    return self._starts[-1]

  def _line(self, index: int) -> tuple[str, int, str]:
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f"document index {index} is outside [0, {len(self)})")
    i = bisect.bisect_right(self._starts, index) - 1
    j = index - self._starts[i]
    return self.files[i], j, _read_line(self.files[i], int(self._offsets[i][j]),
                                        self._decompressed[i])


class TextFileSource(_LinesSource):
  """Local text files as documents: `unit="file"` (one document per file) or `"line"` (one per
  non-blank line, trailing newline removed). `src[i]` -> str."""

  def __init__(self, paths: str | Sequence[str], unit: str = "file"):
    if unit not in ("file", "line"):
      raise ValueError(f"`text_unit` must be 'file' or 'line'; got {unit!r}")
    self.unit = unit
    if unit == "line":
      super().__init__(paths)
    else:
      self.files = resolve_paths(paths)
      for path in self.files:
        _check_text_file(path)

  def __len__(self) -> int:
    return len(self.files) if self.unit == "file" else super().__len__()

  def __getitem__(self, index: int) -> str:
    if self.unit == "line":
      return self._line(index)[2].rstrip("\r\n")
    with open_data_file(self.files[index]) as f:  # binary: no newline translation
      return f.read().decode("utf-8-sig")  # without a byte-order mark

  def __repr__(self) -> str:
    return f"TextFileSource({len(self.files)} files, unit={self.unit!r}, {len(self)} documents)"


class JsonlSource(_LinesSource):
  """Local JSON-lines files; document i is the string `text_field` of the i-th non-blank line."""

  def __init__(self, paths: str | Sequence[str], text_field: str = "text"):
    super().__init__(paths)
    self.text_field = text_field

  def __getitem__(self, index: int) -> str:
    path, line_no, line = self._line(index)
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: non-blank line {line_no + 1} is not valid JSON ({e})") from None
    text = record.get(self.text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
      raise ValueError(f"{path}: non-blank line {line_no + 1} has no string field "
                       f"`text_field` = {self.text_field!r} (keys: "
                       f"{sorted(record) if isinstance(record, dict) else type(record).__name__})")
    return text

  def __repr__(self) -> str:
    return f"JsonlSource({len(self.files)} files, text_field={self.text_field!r}, {len(self)} documents)"


class ParquetSource:
  """Parquet files; document i is the string column `text_field` of the i-th row over the files.

  Rows are read one row group at a time (the last few row groups stay cached), so access in file
  order is cheap and a global shuffle reads about one row group per document: for corpora much
  larger than memory prefer TFDS array_record (`source="tfds"`) or jsonl."""

  def __init__(self, paths: str | Sequence[str], text_field: str = "text", cached_groups: int = 8):
    try:
      import pyarrow.parquet as pq
    except ImportError as e:
      raise ImportError("`data.source='parquet'` needs pyarrow, which is not installed: "
                        "pip install pyarrow") from e
    self._pq, self.files, self.text_field = pq, resolve_paths(paths), text_field
    self._groups = []    # (file index, row group index) in order
    rows = [0]
    for fi, path in enumerate(self.files):
      with storage.open_file(path, "rb") as f:
        meta = pq.ParquetFile(f)
        names = meta.schema_arrow.names
        if text_field not in names:
          raise ValueError(f"{path}: no column `text_field` = {text_field!r} (columns: {names})")
        for g in range(meta.num_row_groups):
          self._groups.append((fi, g))
          rows.append(rows[-1] + meta.metadata.row_group(g).num_rows)
    self._starts = rows
    if rows[-1] == 0:
      raise ValueError(f"`paths`: the files {self.files} hold no row")
    self._read_group = functools.lru_cache(maxsize=cached_groups)(self._read_group_uncached)

  def _read_group_uncached(self, group: int) -> list:
    fi, g = self._groups[group]
    with storage.open_file(self.files[fi], "rb") as f:
      table = self._pq.ParquetFile(f).read_row_group(g, columns=[self.text_field])
    return table.column(0).to_pylist()

  def __len__(self) -> int:
    return self._starts[-1]

  def __getitem__(self, index: int) -> str:
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f"document index {index} is outside [0, {len(self)})")
    group = bisect.bisect_right(self._starts, index) - 1
    text = self._read_group(group)[index - self._starts[group]]
    if isinstance(text, bytes):
      text = text.decode("utf-8")
    if not isinstance(text, str):
      fi, _ = self._groups[group]
      raise ValueError(f"{self.files[fi]}: row {index - self._starts[group]} of row group "
                       f"{self._groups[group][1]} has no string in column {self.text_field!r} "
                       f"(got {type(text).__name__})")
    return text

  def __repr__(self) -> str:
    return f"ParquetSource({len(self.files)} files, text_field={self.text_field!r}, {len(self)} documents)"


class _FieldSource:
  """A random-access source of records -> the text in one field (bytes decoded as UTF-8)."""

  def __init__(self, source, field: str, name: str):
    self.source, self.field, self.name = source, field, name

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> str:
    record = self.source[index]
    if self.field not in record:
      raise ValueError(f"tfds dataset {self.name!r} has no feature `text_field` = {self.field!r}; "
                       f"its features: {sorted(record)}")
    text = record[self.field]
    text = text.item() if isinstance(text, np.ndarray) else text
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)

  def __repr__(self) -> str:
    return f"tfds({self.name!r}, field={self.field!r}, {len(self)} documents)"


def tfds_text_source(name: str, *, split: str = "train", data_dir: str | None = None,
                     text_field: str = "text") -> _FieldSource:
  """A prepared TFDS dataset's `text_field` as a random-access source of str (no download)."""
  if not name:
    raise ValueError("`tfds_name` is empty: name the TFDS dataset to read (e.g. 'lm1b')")
  # lazy: ~1 s to import, and only this source needs it
  tfds = require("tensorflow_datasets", "data.source='tfds'")

  where = data_dir or "~/tensorflow_datasets (or $TFDS_DATA_DIR)"
  how = (f"Prepare it once, in a random-access format, where `tfds_data_dir` points:\n"
         f"  tfds build {name} --file_format=array_record"
         f"{' --data_dir=' + data_dir if data_dir else ''}\n"
         f"or in Python: tfds.builder({name!r}{', data_dir=' + repr(data_dir) if data_dir else ''}, "
         "file_format='array_record').download_and_prepare()\n"
         "(preparing may need tensorflow and the network; training never downloads).")
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(f"`tfds_name`: no TFDS dataset is registered as {name!r}") from None
  except (NotImplementedError, FileNotFoundError, AssertionError) as e:
    raise FileNotFoundError(f"TFDS dataset {name!r} (split {split!r}) is not prepared as "
                            f"array_record under {where}. {how}\n(tfds said: {e})") from None
  return _FieldSource(source, text_field, name)


def tokenize(text: str, tokenizer: Tokenizer, add_bos: bool = True,
             add_eos: bool = True) -> np.ndarray:
  """A document -> its ids, [n] int32, with bos / eos around it if asked."""
  ids = tokenizer.encode(text)
  ids = ([tokenizer.bos_id] if add_bos else []) + list(ids) + ([tokenizer.eos_id] if add_eos else [])
  return np.asarray(ids, np.int32)
