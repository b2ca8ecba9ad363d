"""A fake Google Cloud Storage for tests: gs://BUCKET/... paths map to ROOT/BUCKET/... on local disk.

`fake_gcs(root, monkeypatch)` routes etils.epath's gs:// backend (what lineax_lm.storage and Orbax
use for files and folders) and Orbax's TensorStore kvstore spec for gs:// (what writes the arrays)
to the local folder, and answers Orbax's bucket queries (hierarchical namespace: no). Code that
turns gs:// into a local path by itself (os.path on "gs://b/x" makes "./gs:/b/x") still writes
under the working directory, which the tests check stays empty.
"""
from __future__ import annotations

import os

from etils.epath import backend as epath_backend
from etils.epath import gpath

PREFIX = "gs://"


def fake_gcs(root, monkeypatch):
  root = os.fspath(root)

  def local(path) -> str:
    path = os.fspath(path)
    if path.startswith(root):  # the local backend's own calls (rename checks exists(dst))
      return path
    if not path.startswith(PREFIX):
      raise AssertionError(f"the fake gs:// backend got a non-gs path {path!r}")
    return os.path.join(root, path[len(PREFIX):])

  def remote(path) -> str:
    return PREFIX + os.path.relpath(os.fspath(path), root)

  class FakeGcsBackend(epath_backend._OsPathBackend):  # pylint: disable=protected-access
    def open(self, path, mode, *args, **kwargs):
      if any(m in mode for m in "wax"):
        os.makedirs(os.path.dirname(local(path)), exist_ok=True)  # object stores have no folders
      return super().open(local(path), mode, *args, **kwargs)

    def exists(self, path):
      return super().exists(local(path))

    def isdir(self, path):
      return super().isdir(local(path))

    def listdir(self, path):
      return super().listdir(local(path))

    def glob(self, path):
      return [remote(p) for p in super().glob(local(path))]

    def walk(self, top, *, top_down=True, on_error=None):
      for folder, dirs, files in super().walk(local(top), top_down=top_down, on_error=on_error):
        yield remote(folder), dirs, files

    def makedirs(self, path, *, exist_ok=False, mode=None):
      return super().makedirs(local(path), exist_ok=exist_ok)

    def mkdir(self, path, *, exist_ok=False, mode=None):
      return super().mkdir(local(path), exist_ok=exist_ok)

    def rmtree(self, path):
      return super().rmtree(local(path))

    def remove(self, path):
      return super().remove(local(path))

    def rename(self, path, dst):
      return super().rename(local(path), local(dst))

    def replace(self, path, dst):
      return super().replace(local(path), local(dst))

    def copy(self, path, dst, overwrite):
      return super().copy(local(path), local(dst), overwrite=overwrite)

    def stat(self, path):
      return super().stat(local(path))

  from orbax.checkpoint._src.path import gcs_utils
  monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, "gs", FakeGcsBackend())  # pylint: disable=protected-access
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs",
                      lambda path: {"driver": "file", "path": local(path)})
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)
  monkeypatch.setattr(gcs_utils, "rmtree",
                      lambda path, missing_ok=False: gpath.PosixGPath(path).rmtree(missing_ok=missing_ok))
  return local
