"""Byte tokenizer round trip; a Hugging Face tokenizer built here, saved to tokenizer.json, loaded."""
import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lineax_lm.data.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer as TokenizerProtocol
from lineax_lm.data.tokenizer import load_tokenizer

TEXTS = ["hello world", "Grüße, 世界! 🙂", "", "tabs\tand\nnewlines  ", "the quick brown fox"]


def test_byte_round_trip():
  tok = load_tokenizer("byte")
  assert isinstance(tok, ByteTokenizer) and isinstance(tok, TokenizerProtocol)
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (259, 256, 257, 258)
  for text in TEXTS:
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == text
  with pytest.raises(ValueError, match="bos_token"):
    load_tokenizer("byte", bos_token="<s>")


def _bpe_tokenizer_json(tmp_path, specials=("<s>", "</s>", "<pad>")) -> str:
  hf = Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(TEXTS * 20, trainer=trainer)
  path = tmp_path / "tokenizer.json"
  hf.save(str(path))
  return str(path)


def test_hf_tokenizer_round_trip(tmp_path):
  path = _bpe_tokenizer_json(tmp_path)
  tok = load_tokenizer(path)
  assert isinstance(tok, HFTokenizer) and isinstance(tok, TokenizerProtocol)
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
  assert tok.vocab_size == Tokenizer.from_file(path).get_vocab_size(with_added_tokens=True)
  for text in TEXTS:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id]) == text
  assert len(tok.encode("hello world")) < len("hello world")  # merges were learned
  assert load_tokenizer(str(tmp_path)).vocab_size == tok.vocab_size  # the folder works too


def test_hf_special_tokens(tmp_path):
  path = _bpe_tokenizer_json(tmp_path, specials=("<|endoftext|>", "<|x|>"))
  tok = load_tokenizer(path)  # GPT-2 style: one token is bos, eos and pad
  assert tok.bos_id == tok.eos_id == tok.pad_id == 0
  assert load_tokenizer(path, pad_token="<|x|>").pad_id == 1
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<|x|>"}}))
  assert load_tokenizer(path).bos_id == 1
  with pytest.raises(ValueError, match="eos_token"):
    load_tokenizer(path, eos_token="<missing>")


def test_hf_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_tokenizer(str(tmp_path / "nope.json"))
  path = _bpe_tokenizer_json(tmp_path, specials=("[UNK]",))
  with pytest.raises(ValueError, match="eos_token"):
    load_tokenizer(path)
  with pytest.raises(ValueError, match="tokenizer"):
    load_tokenizer("")
