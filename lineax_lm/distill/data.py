"""Distillation data: the teacher's tokenizer for the data stack, and text sampled from the teacher.

Any text source of lineax_lm.data works (`config.data.source` "text" / "jsonl" / "tfds" with the
teacher's tokenizer). The default needs nothing downloaded: documents sampled from the teacher
itself, generated once into `<workdir>/data/{train,heldout}.jsonl` ({"text": ...} per line) and
reused by every stage and every later run (a file that exists is never regenerated).

Trade-off of teacher samples: no download and no licence question, and the student sees exactly the
distribution it is asked to imitate (stages 1-3 only ever compare it with the teacher); but it learns
the teacher's own distribution, errors and blind spots included, never real text, and a perplexity
measured on teacher samples flatters both models (held-out real text, `config.eval.text_paths`, is
the fairer test). Diversity comes from sampling (temperature, top-p), from a different seed per
batch, and from prompts: the document separator then an opener drawn from OPENERS.

Long documents (`samples.join_tokens` > 0, the study's 2,048): the teacher's samples end after a few
hundred tokens, shorter than the needle and recall contexts the students are scored at. Consecutive
samples are then joined (blank line between them, no document separator) into documents of at
least `join_tokens` tokens, so a training row is one document and a student learns to carry its
state across the whole row. Such a document is several unrelated passages in a row, as a needle
prompt's haystack is; it is not one long coherent text.

Real held-out text (`write_reference_text`): the Python Language Reference topics that every CPython
ships (`pydoc_data.topics`, the PSF-licensed reference manual: English technical prose with code),
written to `<data dir>/python_reference.txt`. Not this project's docs; present on any host that runs
Python, so nothing is downloaded or carried. The teacher saw web text of this kind (maybe this very
text) in pretraining, so its perplexity here is low; the students are compared with it on equal terms.

The data stack's tokenizer is the teacher's: its tokenizer.json is written to `<workdir>/data` with a
tokenizer_config.json naming the document separator (SmolLM2: "<|endoftext|>") as bos, eos and
pad, so packed documents are separated as in pretraining. A teacher without a tokenizer (the tiny
runlocal teacher) uses the byte tokenizer.
"""
from __future__ import annotations

import json
import logging
import os

import jax
import numpy as np
from tqdm import tqdm

from lineax_lm.data.pipeline import make_tokenizer
from lineax_lm.eval.report import write_atomically

log = logging.getLogger("lineax_lm")
OPENERS = ("The", "In", "A", "This", "It", "We", "When", "One", "How", "What", "Once", "There", "As",
           "I", "If", "For", "My", "Today", "Many", "Question", "def", "#", "1", "Chapter", "Dear",
           "Why", "After", "Scientists", "Here", "To")
SEPARATORS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def write_tokenizer(teacher_tokenizer, folder: str) -> str:
  """The teacher's tokenizer as `<folder>/tokenizer.json` + tokenizer_config.json (bos = eos =
  pad = the document separator: the first of SEPARATORS in the vocabulary, else the teacher's eos).
  Returns the folder (a `config.data.tokenizer` value)."""
  os.makedirs(folder, exist_ok=True)
  hf = teacher_tokenizer.hf
  sep = next((t for t in SEPARATORS if hf.token_to_id(t) is not None),
             hf.id_to_token(teacher_tokenizer.eos_id))
  hf.save(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"bos_token": sep, "eos_token": sep, "pad_token": sep}, f)
  return folder


def sample_documents(teacher, tokenizer, *, num_docs: int, max_new_tokens: int, batch_size: int,
                     temperature: float = 1.0, top_p: float | None = None, seed: int = 0,
                     stop_ids=(), min_chars: int = 1) -> list[str]:
  """`num_docs` texts sampled from `teacher` (HybridLM) after [separator, opener] prompts.

  Each batch draws its openers and its sampling key from (seed, batch index). A text ends at the
  first of `stop_ids` (and the tokenizer's bos / eos / pad) or after `max_new_tokens` tokens; texts
  shorter than `min_chars` characters are dropped and replaced by the next batches."""
  stops = np.array(sorted({tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, *stop_ids}))
  openers = np.array([tokenizer.encode(w)[0] for w in OPENERS], np.int32)
  docs, b = [], 0
  bar = tqdm(total=num_docs, unit="doc", desc="teacher samples", mininterval=5, dynamic_ncols=True)
  while len(docs) < num_docs:
    rng = np.random.default_rng((seed, b))
    first = openers[rng.integers(0, len(openers), batch_size)]
    prompt = np.stack([np.full(batch_size, tokenizer.bos_id, np.int32), first], axis=1)
    out = np.asarray(teacher.generate(prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                                      rng=jax.random.key(rng.integers(2**31))))
    for row in out[:, 1:]:
      ends = np.flatnonzero(np.isin(row, stops))
      text = tokenizer.decode(row[:ends[0] if len(ends) else len(row)].tolist())
      if len(text) >= min_chars:
        docs.append(text)
        bar.update(1)
    b += 1
    if b > 4 * (num_docs // batch_size + 1) and len(docs) < num_docs // 2:
      raise RuntimeError(f"the teacher's samples keep ending before {min_chars} characters; lower "
                         "config.samples.min_chars or raise max_new_tokens")
  bar.close()
  return docs[:num_docs]


def write_jsonl(path: str, texts) -> str:
  return write_atomically(path, lambda f: f.writelines(
      json.dumps({"text": text}, ensure_ascii=False) + "\n" for text in texts))


def join_documents(texts, tokenizer, min_tokens: int, joiner: str = "\n\n") -> list[str]:
  """Consecutive texts joined by `joiner` into documents of at least `min_tokens` tokens (the last,
  shorter remainder is dropped). `min_tokens` <= 0 returns the texts unchanged."""
  if min_tokens <= 0:
    return list(texts)
  docs, parts, count = [], [], 0
  for text in texts:
    parts.append(text)
    count += len(tokenizer.encode(text)) + (len(parts) > 1)
    if count >= min_tokens:
      docs.append(joiner.join(parts))
      parts, count = [], 0
  return docs


def write_reference_text(folder: str, max_chars: int | None = None) -> str:
  """The Python Language Reference topics shipped with CPython (module docstring) as one text file
  `<folder>/python_reference.txt` (topics in sorted order, the first `max_chars` characters; an
  existing file is kept). Returns its path (a `config.eval.text_paths` value)."""
  import pydoc_data.topics  # the stdlib's copy of the reference manual (pydoc's help topics)
  path = os.path.join(folder, "python_reference.txt")
  if not os.path.exists(path):
    os.makedirs(folder, exist_ok=True)
    topics = pydoc_data.topics.topics
    text = "\n\n".join(topics[k].strip() for k in sorted(topics))
    write_atomically(path, lambda f: f.write(text[:max_chars]))
  return path


def ensure_teacher_samples(folder: str, teacher, data_config, samples, stop_ids=()) -> dict[str, str]:
  """`<folder>/train.jsonl` and `<folder>/heldout.jsonl` sampled from the teacher (once; existing
  files are reused). `samples`: the config section (num_docs, heldout_docs, max_new_tokens,
  batch_size, temperature, top_p, seed, min_chars); `stop_ids`: more ids that end a text (the
  teacher tokenizer's own bos / eos). Returns {"train": path, "heldout": path}."""
  tokenizer = make_tokenizer(data_config)
  paths = {}
  for split, n, seed in (("train", samples.num_docs, samples.seed),
                         ("heldout", samples.heldout_docs, samples.seed + 1_000_003)):
    path = paths[split] = os.path.join(folder, f"{split}.jsonl")
    if os.path.exists(path):
      continue
    log.info("sampling %d %s documents from the teacher into %s", n, split, path)
    texts = sample_documents(teacher, tokenizer, num_docs=n, max_new_tokens=samples.max_new_tokens,
                             batch_size=samples.batch_size, temperature=samples.temperature,
                             top_p=samples.top_p, seed=seed, min_chars=samples.min_chars,
                             stop_ids=stop_ids)
    texts = join_documents(texts, tokenizer, samples.get("join_tokens", 0))
    if not texts:
      raise ValueError(f"config.samples: {n} {split} samples make no document of "
                       f"{samples.join_tokens} tokens; raise num_docs / heldout_docs")
    write_jsonl(path, texts)
  return paths
