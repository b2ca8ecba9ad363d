"""The cells of the hybrid-ratio study and their folders: each cell's training config (the size's
recipe, the corpus, `--config.*` overrides), the fingerprints that say which config a result was
made under, and `<out>/cells/<cell>/` (result.json, config_fingerprint, a stale folder set aside).
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import shutil

import ml_collections

from lineax_lm.experiments import sizes as sizes_lib

log = logging.getLogger("lineax_lm")


def apply_overrides(config, overrides) -> None:
  """`["train.tokens=1e9", "data.paths=/x/*.jsonl"]` set on `config` (values read as Python
  literals when they parse, else kept as strings); an unknown field is a ValueError."""
  for item in overrides or ():
    key, eq, value = item.partition("=")
    if not eq:
      raise ValueError(f"an override takes field=value; got {item!r}")
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass
    node, *path = key.strip().split(".")
    parent, names = config, [node] + path
    for name in names[:-1]:
      if name not in parent:
        raise ValueError(f"`--config.{item}`: the cell config has no field {key!r}")
      parent = parent[name]
    if names[-1] not in parent:
      raise ValueError(f"`--config.{item}`: the cell config has no field {key!r}")
    if isinstance(value, float) and value.is_integer() and isinstance(parent[names[-1]], int):
      value = int(value)
    parent[names[-1]] = value


def corpus_data(corpus: str, size=None) -> dict:
  """The data fields of a corpus folder made by lineax_lm.experiments.corpus (train shards and a
  held-out file, plain or gzip jsonl), or {} when `corpus` is empty (then `--config.data.paths=...`
  names the data). Training reads the shards only; the grid's scores read the held-out file.
  For a `size` whose corpus is sampled (`Size.sampled_corpus`) the shards are named one by one, so
  the fingerprints say how many a cell trained on (a corpus sampled further is other data); a size
  of CORPUS_TOKENIZER reads the folder's tokenizer/."""
  if not corpus:
    return {}
  from lineax_lm.experiments.corpus import corpus_files, corpus_tokenizer, shard_paths
  files = corpus_files(corpus)
  data = dict(source="jsonl", paths=files["train"], heldout_paths=files["heldout"],
              heldout_fraction=0.0)
  if size is not None and size.sampled_corpus:
    data["paths"] = ",".join(shard_paths(corpus))
  if size is not None and size.tokenizer == sizes_lib.CORPUS_TOKENIZER:
    data["tokenizer"] = corpus_tokenizer(corpus)
  return data


SAMPLED_CORPUS = "corpus"             # <out>/corpus: where a size's sampled corpus is made


def default_corpus(size, out: str | None = None) -> str:
  """The corpus folder a size reads when `--corpus` is not given: its shipped one, `<out>/corpus`
  for a sampled one (`Size.sampled_corpus`; "" without `out`), or "" (none)."""
  if size.sampled_corpus:
    return os.path.join(out, SAMPLED_CORPUS) if out else ""
  if not size.corpus:
    return ""
  from lineax_lm.experiments.corpus import shipped_corpus
  return shipped_corpus(size.corpus)


# Fields that change how a run is stored, logged or read, not what it computes (None: the section).
_UNSCORED_FIELDS = {
    "data": ("num_threads", "prefetch_buffer_size"),
    "train": ("log_every", "checkpoint_every", "async_checkpointing", "keep_checkpoints",
              "restore_step", "profile_steps", "profile_start", "compilation_cache"),
    "eval": None,                       # the grid scores after training (eval.steps = 0)
}
# The model fields that make one cell of a size differ from another (left out of the budget).
_CELL_FIELDS = ("preset", "mixer", "attn_ratio", "attn_layers", "mixer_cfg", "linear_mlp_hidden")
# Size fields that name a grid, say which cells it has, where its default corpus is or when it
# may run, not how one is run (a cell's seed is in its config).
_GRID_FIELDS = ("name", "cells", "seeds", "corpus", "sampled_corpus", "reports_gate", "needs_gate")
# Size fields a cell's config carries (model.vocab_size, model.tie_embeddings, train.grad_accum),
# or that only say which checkpoints are kept (as train.checkpoint_every): counted in the config's
# part, if at all.
_CONFIG_SIZE_FIELDS = ("vocab_size", "tie_embeddings", "grad_accum", "checkpoint_tokens")


def _digest(tree) -> str:
  return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint_tree(config, size) -> dict:
  """What a cell's result depends on: its training config without the storage and logging fields,
  data files by file name (the same corpus is the same data on any machine), and the size's
  evaluation settings."""
  tree = config.to_dict()
  for section, fields in _UNSCORED_FIELDS.items():
    if fields is None:
      tree.pop(section, None)
    else:
      for name in fields:
        tree.get(section, {}).pop(name, None)
  data = tree.get("data", {})
  for key in ("paths", "heldout_paths"):
    if isinstance(data.get(key), str):
      data[key] = [os.path.basename(p.strip()) for p in data[key].split(",") if p.strip()]
  if data.get("tokenizer", "byte") != "byte":  # a tokenizer.json's folder: by name, as the data
    data["tokenizer"] = os.path.basename(os.path.normpath(data["tokenizer"]))
  tree["size"] = {k: v for k, v in dataclasses.asdict(size).items()
                  if k not in _GRID_FIELDS + _CONFIG_SIZE_FIELDS}
  return tree


def config_fingerprint(config, size) -> str:
  """A short hash of `fingerprint_tree`: equal for two runs that compute the same cell."""
  return _digest(fingerprint_tree(config, size))


def budget_fingerprint(config, size) -> str:
  """`config_fingerprint` without the model fields and the seed that tell the cells apart: equal
  for every cell of one grid (data, mix, steps, optimiser, width, evaluation), so results of two
  budgets differ."""
  tree = fingerprint_tree(config, size)
  for name in _CELL_FIELDS:
    tree.get("model", {}).pop(name, None)
  tree.pop("seed", None)              # a cell's seed: several seeds are one budget
  return _digest(tree)


def build_cells(size_name: str, only: str = "", corpus: str | None = None, overrides=(),
                accelerator: bool | None = None) -> list[dict]:
  """{"name", "mixer", "ratio", "seed", "config", "config_fingerprint", "budget_fingerprint", placement
  fields} of the cells to run; `corpus` None: the size's `default_corpus`."""
  if accelerator is None:
    import jax
    accelerator = jax.default_backend() != "cpu"
  size = sizes_lib.get_size(size_name)
  if corpus is None:
    corpus = default_corpus(size)
  out = []
  for mixer, ratio, seed in sizes_lib.parse_cells(only, size):
    c = sizes_lib.cell_config(size, mixer, ratio, accelerator, seed)
    c.data.update(corpus_data(corpus, size))
    apply_overrides(c, overrides)
    out.append(dict(name=sizes_lib.cell_name(mixer, ratio, seed), mixer=mixer, ratio=ratio, seed=seed,
                    config=c,
                    config_fingerprint=config_fingerprint(c, size),
                    budget_fingerprint=budget_fingerprint(c, size), **sizes_lib.placement(c)))
  return out


def heldout_config(config) -> ml_collections.ConfigDict:
  """The data section of a cell's `config` reading its held-out split (what the scores read)."""
  data = ml_collections.ConfigDict(config.data.to_dict())
  data.split = "heldout"
  return data


def result_path(out: str, cell: dict) -> str:
  """`<out>/cells/<cell>/result.json`, written last, once the cell is trained and scored."""
  return os.path.join(out, "cells", cell["name"], "result.json")


FINGERPRINT_FILE = "config_fingerprint"


def stored_fingerprint(out: str, cell: dict) -> str | None:
  """The fingerprint a cell folder was made under: its result's, else the one written when its
  training started; None when neither says (a folder of an older grid, or none yet)."""
  cell_dir = os.path.dirname(result_path(out, cell))
  if os.path.exists(result_path(out, cell)):
    with open(result_path(out, cell)) as f:
      return json.load(f).get("config_fingerprint")
  path = os.path.join(cell_dir, FINGERPRINT_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return f.read().strip()
  return None


def finished(out: str, cell: dict) -> bool:
  """The cell's result.json exists and was made under the cell's config."""
  return (os.path.exists(result_path(out, cell))
          and stored_fingerprint(out, cell) == cell["config_fingerprint"])


def set_aside_if_stale(out: str, cell: dict) -> str | None:
  """Moves the cell's folder to `<out>/stale/<cell>.<its fingerprint>[.n]` when it holds a result
  or a run of another config (or of an unknown one); returns where it went, or None."""
  cell_dir = os.path.dirname(result_path(out, cell))
  if not os.path.isdir(cell_dir):
    return None
  stored = stored_fingerprint(out, cell)
  if stored == cell["config_fingerprint"]:
    return None
  if stored is None and not (os.path.exists(result_path(out, cell))
                             or os.path.exists(os.path.join(cell_dir, "run"))):
    return None                                 # only a log or an empty folder: nothing to mix
  os.makedirs(os.path.join(out, "stale"), exist_ok=True)
  dest = base = os.path.join(out, "stale", f"{cell['name']}.{stored or 'unfingerprinted'}")
  n = 1
  while os.path.exists(dest):
    dest, n = f"{base}.{n}", n + 1
  shutil.move(cell_dir, dest)
  log.warning("cell %s was made under another config (fingerprint %s, now %s): moved to %s; it "
              "runs again", cell["name"], stored, cell["config_fingerprint"], dest)
  return dest


def check_one_budget(results: list[dict]) -> None:
  """A ValueError when `results` come from more than one budget (their `budget_fingerprint`)."""
  budgets: dict = {}
  for r in results:
    budgets.setdefault(r.get("budget_fingerprint"), []).append(r["name"])
  if len(budgets) > 1:
    listing = "; ".join(f"{fp or 'none (an older grid)'}: {', '.join(names)}"
                        for fp, names in budgets.items())
    raise ValueError(f"the cells under this --out were made under {len(budgets)} different budgets "
                     f"({listing}); tables of them would compare unlike runs: move the cells of "
                     "one budget elsewhere, or rerun the grid (it sets stale cells aside)")


def _read_cell_files(out: str, file_name: str) -> list[dict]:
  """The JSON file `file_name` of every cell folder under `<out>/cells` that has one, in the
  grid's order (mixers and ratios as the study lists them, the Transformer last; then seeds): each
  holds the cell's "mixer", "ratio" and "seed"."""
  folder = os.path.join(out, "cells")
  found = []
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
    path = os.path.join(folder, name, file_name)
    if os.path.exists(path):
      with open(path) as f:
        found.append(json.load(f))
  order = {cell: i for i, cell in enumerate(
      [(m, r) for m in sizes_lib.MIXERS for r in sizes_lib.RATIOS] + [sizes_lib.TRANSFORMER])}
  return sorted(found, key=lambda r: (order.get((r.get("mixer"), r.get("ratio")), len(order)),
                                     r.get("seed", 0)))


def load_results(out: str) -> list[dict]:
  """Every finished cell's result.json under `out`, in the grid's order."""
  return _read_cell_files(out, "result.json")


NEEDLE_CURVE_FILE = "needle_curve.json"


def load_needle_curves(out: str) -> list[dict]:
  """Every cell's needle curve under `out` (scoring.score_needle_curve; a cell still training has
  the points of its checkpoints so far), in the grid's order: {"name", "mixer", "ratio", "seed",
  "settings", "points": [{"step", "tokens", "ruler": rows}]}."""
  return _read_cell_files(out, NEEDLE_CURVE_FILE)
