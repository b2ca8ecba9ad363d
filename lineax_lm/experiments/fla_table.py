"""The hybrid-ratio study's tables and plots from fla checkpoint folders: the paper's released
models (fla's format, folders named like 340M-20B-GatedDeltaNet-hybrid-3-1, downloaded beforehand)
or any other, scored as the grid scores its cells.

    python -m lineax_lm.experiments.fla_table --checkpoints='models/340M-20B-*' \
        --out runs/paper_340m [--size small] [--corpus DIR] [--control smollm2]

`--checkpoints`: fla folders, comma-separated, each a path or a glob (quote it). Each folder loads
with lineax_lm.load (lineax_lm.convert.fla: config.json, the weights and tokenizer.json, which the
scores need: text is read in the model's own tokens). Its row of the tables is its fla model type's
mixer (gla, gated_deltanet, delta_net, hgrn, hgrn2, retnet, kda, linear_attn; `transformer` is the
Transformer column), its column the study's ratio nearest to its linear:attention layer count from
fla's `attn` layers ("pure" without them); results.md has the exact ratio.

Scores, per folder, as the grid's `score_model` computes them under `--size`'s evaluation settings
(lineax_lm.experiments.sizes): held-out perplexity and bits per byte of the held-out documents of
`--corpus` (default: the `small` grid's, corpora/smollm2_samples) in rolling windows of the size's
training row length, the RULER-style tasks, MQAR and the efficiency rows. Bits per byte compare
across tokenizers; perplexity does not. Training FLOPs are not known from a checkpoint: the
quality-vs-FLOPs plot leaves these models out.

In `--out`, as in a grid folder (lineax_lm.experiments.grid):
  cells/<folder name>/result.json   one per checkpoint, written once it is scored: a rerun skips a
                                    checkpoint whose result was made of the same config.json,
                                    evaluation settings and corpus
  results.{md,csv,json}, tables.md, claims.md and the plots of every result there
`--tables` refuses results of two model scales (hidden size, depth) in one folder: give each scale
its own `--out`.
"""
from __future__ import annotations

import glob
import json
import math
import os
import sys
import time

import ml_collections

from lineax_lm.eval import report
from lineax_lm.experiments import sizes as sizes_lib
from lineax_lm.experiments.cells import (budget_fingerprint, check_one_budget, config_fingerprint,
                                         corpus_data, heldout_config, load_results)
from lineax_lm.experiments.scoring import CONTROLS, ensure_control, heldout_documents, score_model
from lineax_lm.experiments.tables import write_outputs

HELDOUT_CORPUS = "smollm2_samples"   # the `small` grid's corpus: its held-out documents


def checkpoint_folders(spec: str) -> list[str]:
  """The folders `--checkpoints` names (comma-separated paths or globs), in order, each once;
  ValueError for an item that names no fla checkpoint folder, or two folders of one name (their
  results would share `cells/<name>`)."""
  from lineax_lm.convert.fla import CONFIG_FILE, fla_model_type
  folders = []
  for item in filter(None, (s.strip() for s in spec.split(","))):
    matches = sorted(glob.glob(item)) if glob.has_magic(item) else [item]
    if not matches:
      raise ValueError(f"`--checkpoints`: {item!r} matches no folder")
    for folder in matches:
      folder = os.path.normpath(folder)
      if not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        raise ValueError(f"`--checkpoints`: {folder} is not an fla checkpoint: it has no {CONFIG_FILE}")
      if fla_model_type(folder) is None:
        raise ValueError(f"`--checkpoints`: {os.path.join(folder, CONFIG_FILE)}: its model_type is "
                         "not an fla model type")
      if folder not in folders:
        folders.append(folder)
  if not folders:
    raise ValueError("`--checkpoints` names no folder")
  names: dict = {}
  for folder in folders:
    names.setdefault(os.path.basename(folder), []).append(folder)
  clashes = [paths for paths in names.values() if len(paths) > 1]
  if clashes:
    raise ValueError(f"`--checkpoints`: folders {' and '.join(clashes[0])} share a name; their "
                     "results would share cells/<name>: score them into separate --out folders")
  return folders


def nominal_ratio(num_layers: int, attn_layers) -> str:
  """The study's ratio (sizes.RATIOS, "transformer") nearest in log scale to the placement's
  linear:attention layer count: 1 attention layer of 4 is "3:1", 3 of 24 (effective 7:1) "6:1"."""
  n = len(set(attn_layers))
  if n == 0:
    return "pure"
  if n == num_layers:
    return "transformer"
  hybrid = [r for r in sizes_lib.RATIOS if r != "pure"]
  linear_per_attention = (num_layers - n) / n
  return min(hybrid, key=lambda r: abs(math.log(int(r.split(":")[0]) / linear_per_attention)))


def describe(folder: str, model_config) -> dict:
  """The result fields that place checkpoint `folder` in the tables: name, mixer, ratio, label,
  attention layers, their share and effective ratio."""
  from lineax_lm.convert.fla import CONFIG_FILE, FLA_TYPES
  from lineax_lm.models.placement import effective_ratio
  with open(os.path.join(folder, CONFIG_FILE)) as f:
    model_type = json.load(f)["model_type"]
  mixer = FLA_TYPES[model_type].mixer or "transformer"
  layers = list(model_config.attention_indices)
  ratio = "transformer" if mixer == "transformer" else nominal_ratio(model_config.num_layers, layers)
  return dict(name=os.path.basename(folder), checkpoint=os.path.abspath(folder), model_type=model_type,
              mixer=mixer, ratio=ratio, label=sizes_lib.label(mixer), attn_layers=layers,
              attention_share=len(layers) / model_config.num_layers,
              effective_ratio=effective_ratio(model_config.num_layers, layers))


def heldout_data(size, corpus: str) -> ml_collections.ConfigDict:
  """The data section the scores read: the size's cell data settings on `corpus`, held-out split."""
  config = sizes_lib.cell_config(size, *sizes_lib.TRANSFORMER, accelerator=False)
  config.data.update(corpus_data(corpus))
  return heldout_config(config)


def fingerprints(folder: str, size, data) -> dict:
  """{"config_fingerprint": what a result depends on (the checkpoint's config.json, the size's
  evaluation settings, the held-out data), "budget_fingerprint": the same with only the model's
  width, depth and vocabulary (equal for every model of one scale, as for a grid's cells)}."""
  from lineax_lm.convert.fla import CONFIG_FILE
  with open(os.path.join(folder, CONFIG_FILE)) as f:
    meta = json.load(f)
  scale = {k: meta.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
  tree = lambda model: ml_collections.ConfigDict(dict(model=model, data=data.to_dict()))
  return dict(config_fingerprint=config_fingerprint(tree(meta), size),
              budget_fingerprint=budget_fingerprint(tree(scale), size))


def checkpoint_tokenizer(folder: str, pretrained):
  """The folder's own tokenizer (tokenizer.json); a ValueError naming the folder without one."""
  if pretrained.tokenizer is None:
    raise ValueError(f"{folder} has no tokenizer.json: the scores read text in the model's own "
                     "tokens; put the released model's tokenizer files in the folder")
  vocab = pretrained.tokenizer.vocab_size
  if vocab > pretrained.model.config.vocab_size:
    raise ValueError(f"{folder}: tokenizer.json has {vocab} tokens, more than config.json's "
                     f"vocab_size {pretrained.model.config.vocab_size}")
  return pretrained.tokenizer


def result_path(out: str, folder: str) -> str:
  return os.path.join(out, "cells", os.path.basename(folder), "result.json")


def held_result(folder: str, out: str, prints: dict) -> dict | None:
  """Checkpoint `folder`'s result in `out` when it was made under `prints` (`fingerprints`)."""
  path = result_path(out, folder)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    held = json.load(f)
  return held if held.get("config_fingerprint") == prints["config_fingerprint"] else None


def score_checkpoint(folder: str, size, data, out: str, prints: dict) -> dict:
  """Loads checkpoint `folder`, scores it (`score_model`) and writes its
  `<out>/cells/<name>/result.json`; returns the result."""
  import lineax_lm
  start = time.time()
  pretrained = lineax_lm.load(folder)
  tokenizer = checkpoint_tokenizer(folder, pretrained)
  result = dict(describe(folder, pretrained.model.config), **prints, size=size.name, train_flops=None)
  result.update(score_model(pretrained.model, tokenizer,
                            heldout_documents(data, size.ppl_documents), size, max_len=size.seq_len))
  result["seconds"] = round(time.time() - start, 1)
  path = result_path(out, folder)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  report.write_json(path, result)
  return result


def run_table(checkpoints: list[str], out: str, size_name: str = "small", corpus: str | None = None,
              control: str = "") -> str:
  """Scores every checkpoint folder not yet scored into `out`, printing a line per checkpoint, and
  writes the tables and plots of every result in `out`; returns tables.md's text. `corpus` None:
  the `small` grid's shipped corpus."""
  from lineax_lm.experiments.corpus import shipped_corpus
  size = sizes_lib.get_size(size_name)
  data = heldout_data(size, shipped_corpus(HELDOUT_CORPUS) if corpus is None else corpus)
  os.makedirs(out, exist_ok=True)
  if control:
    ensure_control(size, out, control)
  for i, folder in enumerate(checkpoints, 1):
    step = f"[{i}/{len(checkpoints)}]"
    prints = fingerprints(folder, size, data)
    result = held_result(folder, out, prints)
    if result is not None:
      print(f"{step} {result['name']}: scored before, kept", flush=True)
      continue
    print(f"{step} {folder}: scoring", flush=True)
    result = score_checkpoint(folder, size, data, out, prints)
    ruler = result.get("ruler_mean")
    print(f"{step} {result['name']}: {result['label']} {result['ratio']}, held-out bits per byte "
          f"{result['heldout_bits_per_byte']:.3f}, RULER-style mean "
          f"{'-' if ruler is None else f'{ruler:.3f}'}, MQAR mean {result['mqar_mean']:.3f} "
          f"({result['seconds']} s)", flush=True)
  results = load_results(out)
  check_one_budget(results)
  return write_outputs(results, out)


def define_flags(fv, argv: list[str]) -> None:
  from absl import flags
  flags.DEFINE_string("checkpoints", None, "fla checkpoint folders, comma-separated, each a path or "
                      "a quoted glob ('models/340M-20B-*')", flag_values=fv)
  flags.DEFINE_string("out", None, "the folder of the results, tables and plots", flag_values=fv)
  flags.DEFINE_enum("size", "small", sorted(sizes_lib.SIZES), "the grid size whose evaluation "
                    "settings score the checkpoints", flag_values=fv)
  flags.DEFINE_string("corpus", None, "a folder made by lineax_lm.experiments.corpus whose held-out "
                      f"documents are scored; default: corpora/{HELDOUT_CORPUS}, the small grid's",
                      flag_values=fv)
  flags.DEFINE_enum("control", "", ["", *CONTROLS], "score this teacher on the RULER-style tasks "
                    "first, the positive control of the recall tables (once per --out and "
                    "evaluation settings)", flag_values=fv)
  flags.mark_flags_as_required(["checkpoints", "out"], flag_values=fv)


def main(argv=None) -> int:
  from lineax_lm import cli
  a = cli.parse(define_flags, argv, "python -m lineax_lm.experiments.fla_table", __doc__)
  try:
    folders = checkpoint_folders(a.checkpoints)
    print(run_table(folders, a.out, a.size, a.corpus, a.control))
  except (ValueError, FileNotFoundError) as e:
    cli.fail(e)
  return 0


if __name__ == "__main__":
  sys.exit(main())
