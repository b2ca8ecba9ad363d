"""The training input pipeline: a config section -> a batched, sharded, checkpointable grain iterator.

  it = make_dataset(config.data, seed=0, process_index=jax.process_index(),
                    process_count=jax.process_count())   # a grain DatasetIterator
  batch = next(it)                  # {"inputs", "targets", "loss_mask"[, "segment_ids", "positions"]}
  state = it.get_state()            # save it with the checkpoint (grain.checkpoint.CheckpointSave)
  it2 = make_dataset(...); it2.set_state(state)   # yields exactly the batches `it` yields next

`build_dataset` (same arguments) returns the grain IterDataset itself, for callers that iterate it
more than once.

Every array is numpy int32 of shape [global_batch_size // process_count, seq_len]; `segment_ids`
and `positions` come with packed text ("concat" / "first_fit", see lineax_lm.data.packing).

Order of operations (grain's dataset API throughout):
  MapDataset.source(documents) -> this process's shard [process_index::process_count] of the equal
  split -> shuffle(seed) -> repeat(num_epochs; reshuffled every epoch) -> tokenize -> to_iter_dataset
  -> pack -> [mix in synthetic recall rows] -> batch.
`data.recall_mix` (lineax_lm.data.recall_mix) interleaves a fraction of synthetic in-context
retrieval rows with the packed text rows of the training split (never the held-out split).
MQAR examples have a fixed length, so MQAR stays a MapDataset until after batching: batch s of a run
is a pure function of (config, seed, s). Everything is deterministic given the seed, and a restored
iterator continues bit-for-bit.
"""
from __future__ import annotations

import grain
import ml_collections
from ml_collections import config_dict

from lineax_lm.data import packing, recall_mix, splits, text
from lineax_lm.data.mqar import MQARSource
from lineax_lm.data.tokenizer import Tokenizer, load_tokenizer

SOURCES = ("mqar", "text", "jsonl", "parquet", "tfds")


def default_data_config() -> ml_collections.ConfigDict:
  """The `data` section of a training config, with its defaults."""
  c = ml_collections.ConfigDict()
  c.source = "mqar"              # mqar | text | jsonl | parquet | tfds
  c.seq_len = 256                # tokens per row
  c.global_batch_size = 64       # rows per step over all processes (make_dataset's batch_size wins)
  c.shuffle = True
  c.num_epochs = config_dict.placeholder(int)  # None: repeat forever (training); 1: one pass (eval)
  c.num_threads = 2              # grain read threads (tokenization)
  c.prefetch_buffer_size = 8
  # text / jsonl / parquet / tfds
  c.paths = ""                   # text / jsonl / parquet: files or globs, separated by commas
  c.text_unit = "file"           # text: "file" (a file is a document) | "line" (a line is one)
  c.text_field = "text"          # jsonl / parquet / tfds: the field (column) holding the text
  c.tfds_name = ""               # tfds: a dataset prepared as array_record (never downloaded)
  c.tfds_split = "train"
  # The held-out split (lineax_lm.data.splits): `split` "train" reads the training documents,
  # "heldout" the held-out ones: `heldout_paths` (text / jsonl / parquet) or `tfds_heldout_split`
  # (tfds) when set, else the `heldout_fraction` of the source's documents picked by a hash of their
  # index (then "train" reads the others; 0: no held-out part, "train" reads every document).
  c.split = "train"
  c.heldout_fraction = 0.0
  c.heldout_paths = ""
  c.tfds_heldout_split = ""
  c.tfds_data_dir = config_dict.placeholder(str)  # None: TFDS's default (~/tensorflow_datasets)
  c.tokenizer = "byte"           # "byte" | path of a local tokenizer.json (or its folder)
  c.bos_token = config_dict.placeholder(str)     # tokenizer.json only; None: found automatically
  c.eos_token = config_dict.placeholder(str)
  c.pad_token = config_dict.placeholder(str)
  c.add_bos = True
  c.add_eos = True
  c.packing = "concat"           # concat | first_fit | none (see lineax_lm.data.packing)
  c.num_packing_bins = 16        # first_fit
  # concat / first_fit: sequences per packed row at most, a padding tail counting as one (more rows
  # then); must be <= config.model.max_segments, the model's static bound under jit
  c.max_segments = 16
  # mqar (lineax_lm.data.mqar.MQARSource; seq_len above; examples drawn from `seed`)
  c.mqar = ml_collections.ConfigDict(dict(
      vocab_size=8192, num_kv_pairs=8, power_a=0.01, num_examples=100_000, random_non_queries=True))
  # text sources, split "train": a `fraction` of the rows are synthetic recall rows (MQAR over the
  # first 256 ids, key-value text documents) instead of packed text (lineax_lm.data.recall_mix)
  c.recall_mix = ml_collections.ConfigDict(recall_mix.default_recall_mix_config())
  return c


def make_tokenizer(config) -> Tokenizer:
  """The tokenizer named by a data config section."""
  return load_tokenizer(config.tokenizer, bos_token=config.get("bos_token"),
                        eos_token=config.get("eos_token"), pad_token=config.get("pad_token"))


def data_vocab_size(config) -> int:
  """The number of token ids the data of `config` can hold (the model's vocab must be >= it)."""
  return config.mqar.vocab_size if config.source == "mqar" else make_tokenizer(config).vocab_size


def make_source(config, seed: int):
  """The random-access source of a config section: MQAR examples or text documents (str) of its
  split (`data.split`, see default_data_config)."""
  split = config.get("split", "train")
  if split not in splits.SPLITS:
    raise ValueError(f"`data.split` must be one of {splits.SPLITS}; got {split!r}")
  if config.source == "mqar":
    return _whole_source(config, seed)
  separate = config.get("tfds_heldout_split") if config.source == "tfds" else config.get("heldout_paths")
  fraction = config.get("heldout_fraction") or 0.0
  if split == "heldout" and separate:
    key = "tfds_split" if config.source == "tfds" else "paths"
    heldout = config.copy_and_resolve_references()
    heldout[key] = separate
    return _whole_source(heldout, seed)
  if separate or not fraction:
    if split == "heldout":
      raise ValueError("`data.split`='heldout' needs held-out data: `data.heldout_paths` (or "
                       "`data.tfds_heldout_split` for tfds) or `data.heldout_fraction` > 0")
    return _whole_source(config, seed)
  return splits.SplitSource(_whole_source(config, seed), fraction, split)


def _whole_source(config, seed: int):
  """Every document (or MQAR example) of a config section's source, ignoring the split."""
  if config.source == "mqar":
    m = config.mqar
    return MQARSource(vocab_size=m.vocab_size, seq_len=config.seq_len, num_kv_pairs=m.num_kv_pairs,
                      power_a=m.power_a, num_examples=m.num_examples, seed=seed,
                      random_non_queries=m.random_non_queries)
  if config.source == "text":
    return text.TextFileSource(config.paths, unit=config.text_unit)
  if config.source == "jsonl":
    return text.JsonlSource(config.paths, text_field=config.text_field)
  if config.source == "parquet":
    return text.ParquetSource(config.paths, text_field=config.text_field)
  if config.source == "tfds":
    return text.tfds_text_source(config.tfds_name, split=config.tfds_split,
                                 data_dir=config.tfds_data_dir, text_field=config.text_field)
  raise ValueError(f"`data.source` must be one of {SOURCES}; got {config.source!r}")


def _shard(ds: grain.MapDataset, shard: grain.sharding.ShardOptions) -> grain.MapDataset:
  """This process's part of an equal split (the remainder of len % count is dropped)."""
  n = len(ds) - len(ds) % shard.shard_count
  if n == 0:
    raise ValueError(f"the source has {len(ds)} documents/examples, fewer than the "
                     f"{shard.shard_count} processes that share it")
  return ds[:n][shard.shard_index::shard.shard_count]


def make_dataset(config, *, seed: int, process_index: int | None = None,
                 process_count: int | None = None, batch_size: int | None = None,
                 drop_remainder: bool = True) -> grain.DatasetIterator:
  """The batched training iterator of a data config section: `iter(build_dataset(...))`."""
  return iter(build_dataset(config, seed=seed, process_index=process_index,
                            process_count=process_count, batch_size=batch_size,
                            drop_remainder=drop_remainder))


def build_dataset(config, *, seed: int, process_index: int | None = None,
                  process_count: int | None = None, batch_size: int | None = None,
                  drop_remainder: bool = True) -> grain.IterDataset:
  """The batched training dataset of a data config section (see the module docstring).

  Args:
    config: a section like `default_data_config()`.
    seed: shuffles, packs and (MQAR) generates examples; the same seed gives the same batches.
    process_index, process_count: this process's shard; both None: grain's `ShardByJaxProcess`.
    batch_size: the global batch (rows per step over all processes); None: config.global_batch_size.
      Each process gets batch_size // process_count rows.
    drop_remainder: drop a last partial batch (finite `num_epochs` only).
  Returns:
    a grain IterDataset; `iter()` of it is a DatasetIterator with get_state() / set_state(), whose
    batches are dicts of [batch_size // process_count, seq_len] int32 numpy arrays.
  """
  if config.source not in SOURCES:
    raise ValueError(f"`data.source` must be one of {SOURCES}; got {config.source!r}")
  if (process_index is None) != (process_count is None):
    raise ValueError("give both `process_index` and `process_count`, or neither")
  if process_index is not None and not 0 <= process_index < process_count:
    raise ValueError(f"`process_index` must be in [0, process_count = {process_count}); got "
                     f"{process_index}")
  shard = (grain.sharding.ShardByJaxProcess(drop_remainder=True) if process_index is None else
           grain.sharding.ShardOptions(process_index, process_count, drop_remainder=True))
  global_batch = config.global_batch_size if batch_size is None else batch_size
  if global_batch < 1 or global_batch % shard.shard_count:
    raise ValueError(f"the global batch size {global_batch} must be a positive multiple of "
                     f"process_count = {shard.shard_count}")
  local_batch = global_batch // shard.shard_count
  if config.seq_len < 1 or (config.num_epochs is not None and config.num_epochs < 1):
    raise ValueError(f"`data.seq_len` must be >= 1 and `data.num_epochs` None or >= 1; got "
                     f"{config.seq_len} and {config.num_epochs}")
  mix = config.get("recall_mix") or {}
  mix_fraction = 0.0
  if config.source != "mqar":  # fail on a bad tokenizer or packing mode before reading any file
    tokenizer = make_tokenizer(config)
    if config.packing not in packing.PACKING_MODES:
      raise ValueError(f"`data.packing` must be one of {packing.PACKING_MODES}; got {config.packing!r}")
    mix_fraction = recall_mix.check_recall_mix(mix, source=config.source, seq_len=config.seq_len,
                                               vocab_size=tokenizer.vocab_size,
                                               max_segments=config.get("max_segments"),
                                               packed=config.packing != "none")
  else:
    recall_mix.check_recall_mix(mix, source=config.source, seq_len=config.seq_len, vocab_size=0)

  ds = _shard(grain.MapDataset.source(make_source(config, seed)), shard)
  if config.shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(config.num_epochs)
  read = grain.ReadOptions(num_threads=config.num_threads,
                           prefetch_buffer_size=config.prefetch_buffer_size)
  if config.source == "mqar":
    return ds.batch(local_batch, drop_remainder=drop_remainder).to_iter_dataset(read)

  add_bos, add_eos = config.add_bos, config.add_eos
  ds = ds.map(lambda doc: text.tokenize(doc, tokenizer, add_bos, add_eos)).to_iter_dataset(read)
  ds = packing.pack(ds, mode=config.packing, seq_len=config.seq_len, pad_id=tokenizer.pad_id,
                    num_packing_bins=config.num_packing_bins, seed=seed,
                    max_segments=config.get("max_segments"))
  if mix_fraction and config.get("split", "train") == "train":
    rows = recall_mix.RecallRows(kinds=mix.kinds, seq_len=config.seq_len, tokenizer=tokenizer,
                                 seed=seed, mqar_kv_pairs=mix.get("mqar_kv_pairs", 32),
                                 mqar_loss_weight=mix.get("mqar_loss_weight", 1),
                                 mqar_shapes=mix.get("mqar_shapes", ""),
                                 with_segments=config.packing != "none")
    ds = recall_mix.mix_rows(ds, mix_fraction, rows, shard_index=shard.shard_index,
                             shard_count=shard.shard_count, read=read)
  return ds.batch(local_batch, drop_remainder=drop_remainder)
