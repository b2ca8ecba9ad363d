"""Paths on local disk and on object stores (gs://, s3://, ...) through one library, etils.epath
(the one Orbax writes checkpoints with).

  path = storage.as_path("gs://bucket/runs/x")     # or "runs/x": made absolute
  storage.is_local(path)

Object stores cannot append to a file and tensorboardX cannot write to them without
google-cloud-storage, so `Staged` keeps a local copy of a remote folder's files that are written
incrementally (metrics.jsonl, TensorBoard events) and uploads the changed ones on `sync()`; for a
local folder it is the folder itself and `sync()` does nothing.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time

from etils import epath

log = logging.getLogger("lineax_lm")


def is_remote(path) -> bool:
  """True for a URI with a scheme (gs://, s3://, ...): anything `os.path` must not touch."""
  return "://" in os.fspath(path)


def is_local(path) -> bool:
  return not is_remote(path)


def as_path(path) -> epath.Path:
  """`path` as an epath.Path: URIs unchanged, local paths absolute (Orbax wants absolute paths)."""
  if isinstance(path, epath.Path) and is_remote(path):
    return path
  text = os.fspath(path)
  return epath.Path(text if is_remote(text) else os.path.abspath(os.path.expanduser(text)))


def join(path, *parts) -> str:
  """`path / parts` as a string, for APIs that take strings (remote URIs keep their scheme)."""
  return os.fspath(as_path(path).joinpath(*parts))


class Staged:
  """A local folder standing for `target`: files written into `.local` appear under `target` after
  `sync()` (each file copied whole when its size or mtime changed since the last sync). `download`
  fetches existing remote files first (a resumed run appends to its metrics.jsonl).

  min_interval_s: `sync(force=False)` uploads at most this often (a remote write per log line would
  dominate small steps); `close()` always uploads."""

  def __init__(self, target, *, download: tuple[str, ...] = (), min_interval_s: float = 30.0):
    self.target = as_path(target)
    self.remote = is_remote(self.target)
    self.min_interval_s = min_interval_s
    self._last_sync = 0.0
    self._seen: dict[str, tuple[int, int]] = {}
    if not self.remote:
      self.local = os.fspath(self.target)
      os.makedirs(self.local, exist_ok=True)
      return
    self.local = tempfile.mkdtemp(prefix="lineax_staged_")
    self.target.mkdir(parents=True, exist_ok=True)
    for name in download:
      src = self.target / name
      if src.exists():
        dst = os.path.join(self.local, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with src.open("rb") as f, open(dst, "wb") as out:
          shutil.copyfileobj(f, out)
        st = os.stat(dst)
        self._seen[name] = (st.st_size, st.st_mtime_ns)

  def sync(self, force: bool = True):
    if not self.remote or (not force and time.monotonic() - self._last_sync < self.min_interval_s):
      return
    self._last_sync = time.monotonic()
    for root, _, files in os.walk(self.local):
      for name in files:
        path = os.path.join(root, name)
        rel = os.path.relpath(path, self.local)
        st = os.stat(path)
        if self._seen.get(rel) == (st.st_size, st.st_mtime_ns):
          continue
        dst = self.target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as f, dst.open("wb") as out:
          shutil.copyfileobj(f, out)
        self._seen[rel] = (st.st_size, st.st_mtime_ns)

  def close(self):
    self.sync(force=True)
    if self.remote:
      shutil.rmtree(self.local, ignore_errors=True)


def open_file(path, mode: str = "rb"):
  """The builtin `open` for a local file, epath's (object stores) for a URI."""
  return as_path(path).open(mode) if is_remote(path) else open(path, mode)


def is_file(path) -> bool:
  return as_path(path).is_file() if is_remote(path) else os.path.isfile(path)


def size(path) -> int:
  return as_path(path).stat().length if is_remote(path) else os.path.getsize(path)


def sha256(path) -> tuple[int, str]:
  """(size in bytes, sha256 hex digest) of a file, local or on an object store, read in 1 MiB
  blocks."""
  digest, n = hashlib.sha256(), 0
  with as_path(path).open("rb") as f:
    while block := f.read(1 << 20):
      digest.update(block)
      n += len(block)
  return n, digest.hexdigest()


def glob_files(pattern: str) -> list[str]:
  """The files `pattern` matches, sorted ("**" recursive); a URI's pattern goes through epath."""
  if not is_remote(pattern):
    import glob
    return sorted(m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m))
  scheme, rest = pattern.split("://", 1)
  parts = rest.split("/")
  fixed = next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))
  base = epath.Path(f"{scheme}://" + "/".join(parts[:fixed]))
  return sorted(os.fspath(m) for m in base.glob("/".join(parts[fixed:])) if m.is_file())


def has_magic(pattern: str) -> bool:
  return any(c in os.fspath(pattern) for c in "*?[")
