"""Chat data for the optional SFT stage: ChatML rendering with assistant-only loss masks.

SmolLM2's chat template (the GGUF's `tokenizer.chat_template`, Jinja) is ChatML: every message is
`<|im_start|>{role}\\n{content}<|im_end|>\\n`, a conversation that does not open with a system
message gets `<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging
Face<|im_end|>\\n` first, and a generation prompt is `<|im_start|>assistant\\n`. jinja2 is not a
dependency, so we implement that template directly instead of evaluating it: `chatml_system(template)`
checks that a template is this ChatML one and reads its default system message from it (a template
of another form raises), and `render_chat` writes the text. The loss covers what the assistant
writes: each assistant message's content and its closing `<|im_end|>` (so the model learns to stop),
never the role headers, the other turns or the newline after `<|im_end|>`.

Data: JSON lines with a "messages" list of {"role", "content"} (the OpenAI / Hugging Face chat
layout). `chat_dataset` has the signature of `lineax_lm.data.make_dataset`: one conversation per row,
cut to `seq_len` + 1 tokens and padded (loss_mask 0 on padding), as a checkpointable grain iterator.
"""
from __future__ import annotations

import json
import re

import grain
import numpy as np

from lineax_lm.data.packing import pad_example
from lineax_lm.data.pipeline import make_tokenizer
from lineax_lm.data.text import resolve_paths

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_SYSTEM_RE = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.S)


def chatml_system(template: str | None) -> str | None:
  """The default system message of a ChatML chat template (None when it adds none); ValueError when
  `template` is not ChatML. None (no template) -> None."""
  if template is None:
    return None
  if IM_START not in template or IM_END not in template or "message['content']" not in template:
    raise ValueError("chat_template: only ChatML templates (<|im_start|>role\\ncontent<|im_end|>, "
                     "SmolLM2's) are implemented; give config.stages.sft.system explicitly")
  m = _SYSTEM_RE.search(template)
  return None if m is None else m.group(1)


def render_chat(messages, default_system: str | None = None,
                add_generation_prompt: bool = False) -> list[tuple[str, bool]]:
  """messages [{"role", "content"}, ...] -> ChatML text pieces (text, trained?); their
  concatenation is the template's output."""
  if not messages:
    raise ValueError("messages: a conversation needs at least one message")
  for m in messages:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(
        m.get("content"), str):
      raise ValueError(f"messages: every message needs string 'role' and 'content'; got {m!r}")
  pieces = []
  if default_system is not None and messages[0]["role"] != "system":
    pieces.append((f"{IM_START}system\n{default_system}{IM_END}\n", False))
  for m in messages:
    trained = m["role"] == "assistant"
    pieces += [(f"{IM_START}{m['role']}\n", False), (m["content"] + IM_END, trained), ("\n", False)]
  if add_generation_prompt:
    pieces.append((f"{IM_START}assistant\n", False))
  return pieces


def tokenize_chat(tokenizer, messages, default_system: str | None = None):
  """-> (ids [n] int32, mask [n] int32: 1 on the tokens the assistant writes)."""
  ids, mask = [], []
  for text, trained in render_chat(messages, default_system):
    piece = tokenizer.encode(text)
    ids += piece
    mask += [int(trained)] * len(piece)
  return np.asarray(ids, np.int32), np.asarray(mask, np.int32)


def chat_example(ids: np.ndarray, mask: np.ndarray, seq_len: int, pad_id: int) -> dict:
  """A conversation -> one padded row {"inputs", "targets", "loss_mask"} of seq_len (cut to
  seq_len + 1 tokens; a target is trained when its token is the assistant's)."""
  ids, mask = ids[:seq_len + 1], mask[:seq_len + 1]
  return pad_example({"inputs": ids[:-1], "targets": ids[1:], "loss_mask": mask[1:]}, seq_len, pad_id)


def read_conversations(paths, field: str = "messages") -> list:
  out = []
  for path in resolve_paths(paths):
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          record = json.loads(line)
          if not isinstance(record, dict) or not isinstance(record.get(field), list):
            raise ValueError(f"{path}: line {n} has no list field {field!r} of chat messages")
          out.append(record[field])
  if not out:
    raise ValueError(f"paths: {paths!r} hold no conversation")
  return out


def chat_dataset(config, *, seed: int, process_index: int | None = None,
                 process_count: int | None = None, batch_size: int | None = None,
                 drop_remainder: bool = True, default_system: str | None = None):
  """A `make_dataset` for chat JSON lines (`config.paths`, field `config.text_field` holding the
  messages): batches {"inputs", "targets", "loss_mask"} [batch // process_count, seq_len] int32."""
  tokenizer = make_tokenizer(config)
  index, count = (0, 1) if process_index is None else (process_index, process_count)
  convs = read_conversations(config.paths, config.text_field)
  batch = (config.global_batch_size if batch_size is None else batch_size) // count
  ds = grain.MapDataset.source(convs)[index::count]
  if config.shuffle:
    ds = ds.shuffle(seed=seed)
  seq_len, pad = config.seq_len, tokenizer.pad_id
  ds = ds.repeat(config.num_epochs).map(
      lambda msgs: chat_example(*tokenize_chat(tokenizer, msgs, default_system), seq_len, pad))
  return iter(ds.to_iter_dataset().batch(batch, drop_remainder=drop_remainder))
