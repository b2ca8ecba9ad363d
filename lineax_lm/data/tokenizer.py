"""Tokenizers for the input pipelines, behind one small interface (`Tokenizer`):

  tok.encode(text) -> list[int]      tok.decode(ids) -> str
  tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id

- `ByteTokenizer`: UTF-8 bytes 0..255 plus bos = 256, eos = 257, pad = 258 (vocab 259). Needs no
  file and no download; the default.
- `HFTokenizer`: a Hugging Face `tokenizers.Tokenizer` read from a local tokenizer.json.

`load_tokenizer("byte")` or `load_tokenizer("/path/to/tokenizer.json")` (or the folder holding it).
"""
from __future__ import annotations

import json
import os
from typing import Protocol, Sequence, runtime_checkable

import tokenizers


@runtime_checkable
class Tokenizer(Protocol):
  vocab_size: int
  bos_id: int
  eos_id: int
  pad_id: int

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Sequence[int]) -> str:
    ...


class ByteTokenizer:
  """UTF-8 bytes as ids 0..255; specials bos = 256, eos = 257, pad = 258."""
  bos_id, eos_id, pad_id = 256, 257, 258
  vocab_size = 259

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids: Sequence[int]) -> str:
    """Special ids are dropped; invalid UTF-8 (a cut multi-byte character) decodes to U+FFFD."""
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

  def __repr__(self) -> str:
    return "ByteTokenizer(vocab_size=259, bos_id=256, eos_id=257, pad_id=258)"


# Special-token strings tried, in order, when neither the caller nor tokenizer_config.json names one.
_CANDIDATES = {
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|endoftext|>", "[CLS]"),
    "eos": ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "[SEP]"),
    "pad": ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>"),
}


class HFTokenizer:
  """A Hugging Face `tokenizers.Tokenizer` from a local tokenizer.json.

  `encode` adds no special tokens (the pipelines add bos/eos themselves); `decode` drops them.
  Special tokens are resolved, for each of bos / eos / pad, from the given token string, else the
  `<name>_token` of a tokenizer_config.json beside the file, else the first of a list of common
  names present in the vocabulary; a missing bos falls back to eos and a missing pad to eos.
  """

  def __init__(self, path: str | os.PathLike[str], *, bos_token: str | None = None,
               eos_token: str | None = None, pad_token: str | None = None):
    path = os.fspath(path)
    if os.path.isdir(path):
      path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
      raise FileNotFoundError(f"tokenizer: no tokenizer.json at {path!r} (give the path of a local "
                              "tokenizer.json or of the folder that holds it, or 'byte')")
    self.path = path
    self.hf = read_tokenizer_json(path)
    self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
    side = _side_config(os.path.dirname(path))
    given = {"bos": bos_token, "eos": eos_token, "pad": pad_token}
    ids = {name: self._resolve(name, given[name], side) for name in ("bos", "eos", "pad")}
    if ids["eos"] is None:
      ids["eos"] = ids["bos"]
    if ids["eos"] is None:
      raise ValueError(f"tokenizer: {path} has none of the end-of-text tokens "
                       f"{_CANDIDATES['eos'] + _CANDIDATES['bos']}; name one with `eos_token`")
    self.eos_id = ids["eos"]
    self.bos_id = self.eos_id if ids["bos"] is None else ids["bos"]
    self.pad_id = self.eos_id if ids["pad"] is None else ids["pad"]

  def _resolve(self, name: str, token: str | None, side: dict) -> int | None:
    if token is not None:
      token_id = self.hf.token_to_id(token)
      if token_id is None:
        raise ValueError(f"`{name}_token` {token!r} is not in the vocabulary of {self.path}")
      return token_id
    token = side.get(f"{name}_token")
    token = token.get("content") if isinstance(token, dict) else token
    for candidate in ((token,) if isinstance(token, str) else ()) + _CANDIDATES[name]:
      token_id = self.hf.token_to_id(candidate)
      if token_id is not None:
        return token_id
    return None

  def encode(self, text: str) -> list[int]:
    return self.hf.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

  def __repr__(self) -> str:
    return (f"HFTokenizer({self.path!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})")


def read_tokenizer_json(path: str) -> tokenizers.Tokenizer:
  """`tokenizers.Tokenizer.from_file`, whose errors (a bare Exception such as "EOF while parsing an
  object at line 13 column 15" for a truncated file) name neither the file nor what it is."""
  try:
    return tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # the Rust parser raises plain Exception
    raise ValueError(f"tokenizer: {path} is not a readable tokenizer.json ({e}; "
                     f"{os.path.getsize(path)} bytes: truncated or damaged?)") from None


def read_json_file(path: str, what: str) -> dict:
  """A JSON file as a dict; a ValueError naming the file, line and column when it is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{what}: {path} is not valid JSON (line {e.lineno}, column {e.colno}: "
                     f"{e.msg})") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{what}: {path}, byte offset {e.start}: not valid UTF-8 "
                     f"({e.reason})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{what}: {path} holds a JSON {type(value).__name__}, not an object")
  return value


def _side_config(folder: str) -> dict:
  side = os.path.join(folder, "tokenizer_config.json")
  if not os.path.isfile(side):
    return {}
  return read_json_file(side, "tokenizer")


def load_tokenizer(name: str, *, bos_token: str | None = None, eos_token: str | None = None,
                   pad_token: str | None = None) -> Tokenizer:
  """"byte" -> ByteTokenizer(); a path to a tokenizer.json (or its folder) -> HFTokenizer."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"`tokenizer` must be 'byte' or the path of a tokenizer.json; got {name!r}")
  if name == "byte":
    if any(t is not None for t in (bos_token, eos_token, pad_token)):
      raise ValueError("`bos_token` / `eos_token` / `pad_token` apply to a tokenizer.json only; the "
                       "byte tokenizer's specials are fixed (256, 257, 258)")
    return ByteTokenizer()
  return HFTokenizer(name, bos_token=bos_token, eos_token=eos_token, pad_token=pad_token)
