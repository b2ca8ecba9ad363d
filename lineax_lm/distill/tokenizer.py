"""Teacher tokenizers: a Hugging Face `tokenizers.Tokenizer` built from a GGUF vocabulary or read
from a tokenizer.json, behind a small interface (encode, decode, vocab_size, bos_id, eos_id, pad_id).

GGUF stores a byte-level BPE tokenizer ("tokenizer.ggml.model" == "gpt2") as its token strings (in
GPT-2's byte-to-unicode alphabet), its merges ("a b" strings, rank order), token types (1 normal,
3 control = special, 4 user-defined) and the name of the pre-tokenizer ("tokenizer.ggml.pre"). We
rebuild exactly the tokenizer.json pipeline those names stand for:
  - "smollm" / "starcoder": Digits(individual_digits) then ByteLevel with GPT-2's regex
    (SmolLM/SmolLM2's tokenizer.json; llama.cpp splits `\\p{N}` first, then the GPT-2 regex);
  - "gpt-2" / "gpt2": ByteLevel with GPT-2's regex.
A file that embeds its tokenizer.json ("tokenizer.huggingface.json") is used as is.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from lineax_lm.data.tokenizer import read_json_file, read_tokenizer_json

_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
_DIGITS_THEN_BYTELEVEL = ("smollm", "starcoder")
_BYTELEVEL = ("gpt-2", "gpt2")


class TeacherTokenizer:
  """A `tokenizers.Tokenizer` plus the ids a language model needs.

  Attributes:
    hf: the underlying `tokenizers.Tokenizer` (use it for offsets, batches, to_str()).
    bos_id, eos_id, pad_id: special ids (pad falls back to eos when the checkpoint has none).
    chat_template: the checkpoint's Jinja chat template string, or None.
  """

  def __init__(self, hf: tokenizers.Tokenizer, *, bos_id: int | None, eos_id: int | None,
               pad_id: int | None = None, chat_template: str | None = None):
    n = hf.get_vocab_size(with_added_tokens=True)
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
      if value is not None and not 0 <= value < n:
        raise ValueError(f"{name}: {value} is outside the vocabulary of {n} tokens")
    self.hf = hf
    self.bos_id, self.eos_id = bos_id, eos_id
    self.pad_id = eos_id if pad_id is None else pad_id
    self.chat_template = chat_template

  @property
  def vocab_size(self) -> int:
    """Number of token ids, added/special tokens included."""
    return self.hf.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """text -> token ids. Special tokens written in the text ("<|im_start|>") map to their ids;
    `add_special_tokens` applies the checkpoint's post-processor (BOS/EOS if the checkpoint adds
    them; SmolLM2 adds none)."""
    return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """token ids -> text (special tokens dropped unless `skip_special_tokens=False`, as in
    `tokenizers.Tokenizer.decode`)."""
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    return self.hf.token_to_id(token)

  def id_to_token(self, token_id: int) -> str | None:
    return self.hf.id_to_token(int(token_id))

  def __repr__(self) -> str:
    return (f"TeacherTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})")


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
  bytelevel = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
  if pre in _DIGITS_THEN_BYTELEVEL:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bytelevel])
  if pre in _BYTELEVEL:
    return bytelevel
  raise ValueError(f"tokenizer.ggml.pre: pre-tokenizer {pre!r} is not supported (supported: "
                   f"{_DIGITS_THEN_BYTELEVEL + _BYTELEVEL}); use the model's tokenizer.json instead")


def _post_processor(tokens: Sequence[str], bos: int | None, eos: int | None, add_bos: bool,
                    add_eos: bool) -> processors.PostProcessor:
  if not (add_bos and bos is not None) and not (add_eos and eos is not None):
    return processors.ByteLevel(trim_offsets=False)
  pre = [tokens[bos]] if add_bos and bos is not None else []
  post = [tokens[eos]] if add_eos and eos is not None else []
  special = [(tokens[i], i) for i in {bos if pre else None, eos if post else None} - {None}]
  return processors.TemplateProcessing(
      single=" ".join(pre + ["$A"] + post),
      pair=" ".join(pre + ["$A"] + post + pre + ["$B:1"] + post),
      special_tokens=special)


def tokenizer_from_gguf_metadata(metadata: dict[str, Any]) -> TeacherTokenizer:
  """GGUF key/values (see `gguf_file.read_metadata`) -> TeacherTokenizer (byte-level BPE)."""
  key = "tokenizer.ggml."
  bos, eos = metadata.get(key + "bos_token_id"), metadata.get(key + "eos_token_id")
  pad = metadata.get(key + "padding_token_id")
  chat_template = metadata.get("tokenizer.chat_template")
  if "tokenizer.huggingface.json" in metadata:
    try:
      hf = tokenizers.Tokenizer.from_str(metadata["tokenizer.huggingface.json"])
    except Exception as e:  # the Rust parser raises plain Exception
      raise ValueError(f"tokenizer.huggingface.json: the tokenizer the GGUF metadata embeds is not "
                       f"readable ({e})") from None
    return TeacherTokenizer(hf, bos_id=bos, eos_id=eos, pad_id=pad, chat_template=chat_template)
  kind = metadata.get(key + "model")
  if kind != "gpt2":
    raise ValueError(f"tokenizer.ggml.model: {kind!r} is not supported (only byte-level BPE, "
                     "'gpt2'); load the model's tokenizer.json with `load_tokenizer_json`")
  tokens = metadata.get(key + "tokens")
  merges = metadata.get(key + "merges")
  if not tokens or merges is None:
    raise ValueError("metadata: GGUF file lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
  types = metadata.get(key + "token_type") or [_NORMAL] * len(tokens)
  if len(types) != len(tokens):
    raise ValueError(f"tokenizer.ggml.token_type: {len(types)} types for {len(tokens)} tokens")
  vocab = {tok: i for i, tok in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError("tokenizer.ggml.tokens: duplicate token strings cannot form a BPE vocabulary")
  pairs = []
  for rank, merge in enumerate(merges):
    parts = merge.split(" ")
    if len(parts) != 2:
      raise ValueError(f"tokenizer.ggml.merges[{rank}]: {merge!r} is not two space-separated tokens")
    pairs.append((parts[0], parts[1]))

  hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                                       byte_fallback=False))
  hf.pre_tokenizer = _pre_tokenizer(metadata.get(key + "pre", "gpt-2"))
  hf.decoder = decoders.ByteLevel()
  hf.post_processor = _post_processor(tokens, bos, eos, bool(metadata.get(key + "add_bos_token")),
                                      bool(metadata.get(key + "add_eos_token")))
  special = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
             for i, t in enumerate(types) if t == _CONTROL]
  user = [tokenizers.AddedToken(tokens[i], special=False, normalized=False)
          for i, t in enumerate(types) if t == _USER_DEFINED]
  hf.add_special_tokens(special)
  hf.add_tokens(user)
  return TeacherTokenizer(hf, bos_id=bos, eos_id=eos, pad_id=pad, chat_template=chat_template)


def load_tokenizer_json(path: str | os.PathLike[str], *, bos_id: int | None = None,
                        eos_id: int | None = None, pad_id: int | None = None,
                        chat_template: str | None = None) -> TeacherTokenizer:
  """tokenizer.json (a Hugging Face `tokenizers` file) -> TeacherTokenizer.

  Missing special ids and chat template are taken from a tokenizer_config.json beside the file
  (its bos_token / eos_token / pad_token strings and chat_template), if there is one.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"path: no tokenizer.json at {path!r}")
  hf = read_tokenizer_json(path)
  side = os.path.join(os.path.dirname(path), "tokenizer_config.json")
  extra = read_json_file(side, "tokenizer") if os.path.isfile(side) else {}

  def from_config(value, key):
    if value is not None:
      return value
    token = extra.get(key)
    token = token.get("content") if isinstance(token, dict) else token
    return hf.token_to_id(token) if isinstance(token, str) else None

  return TeacherTokenizer(hf, bos_id=from_config(bos_id, "bos_token"),
                          eos_id=from_config(eos_id, "eos_token"),
                          pad_id=from_config(pad_id, "pad_token"),
                          chat_template=chat_template or extra.get("chat_template"))
