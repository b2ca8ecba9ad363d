"""Bad inputs and configs fail early with an error that names what is wrong (issue 22's input
cases): packed rows within the model's segment bound, every numeric config field range-checked
before compiling, the "did you mean" helper on every --config form, data / tokenizer / GGUF files
that are empty, truncated or not UTF-8, and eval lengths below 1."""
from __future__ import annotations

import dataclasses
import json
import os
import re

import grain
import gguf
import numpy as np
import pytest
from flax import nnx

import lineax_lm
from lineax_lm.data import text
from lineax_lm.data.packing import check_segments, pack
from lineax_lm.data.pipeline import data_vocab_size, default_data_config, make_dataset
from lineax_lm.data.tokenizer import ByteTokenizer, load_tokenizer
from lineax_lm.distill.gguf_file import read_gguf_llama
from lineax_lm.distill.tokenizer import load_tokenizer_json
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import HybridLM
from lineax_lm.models.pretrained import Pretrained, from_pretrained, save_pretrained
from lineax_lm.train import validation
from lineax_lm.train.config import base_config
from tests.lineax_lm.tiny import tiny_config

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sequences_per_row(segment_ids: np.ndarray) -> np.ndarray:
  """The model's count (models.hybrid.make_packing): each piece, and a padding tail as one more."""
  return 1 + np.sum(segment_ids[:, 1:] != segment_ids[:, :-1], axis=1)


def short_lines(tmp_path, n=600):
  """One text file of 3-word lines: at seq_len 256, 22-24 documents per concatenated row."""
  path = tmp_path / "short.txt"
  path.write_text("".join(f"w{i} x y\n" for i in range(n)))
  return str(path)


def text_config(paths, **overrides):
  c = default_data_config()
  c.update(dict(source="text", paths=paths, text_unit="line", seq_len=256, global_batch_size=4,
                num_epochs=1, shuffle=False))
  c.update(overrides)
  return c


def pairs(rows):
  """The multiset of (input, target) pairs the rows train on, sorted."""
  out = []
  for row in rows:
    m = row["loss_mask"].astype(bool)
    out += list(zip(row["inputs"][m].tolist(), row["targets"][m].tolist()))
  return sorted(out)


# ------------------------------------------------------------------------------ packing bound
@pytest.mark.parametrize("packing", ["concat", "first_fit"])
def test_packed_rows_stay_within_max_segments(tmp_path, packing):
  config = text_config(short_lines(tmp_path), packing=packing)
  batches = list(make_dataset(config, seed=0, process_index=0, process_count=1))
  counts = sequences_per_row(np.concatenate([b["segment_ids"] for b in batches]))
  assert counts.max() <= config.max_segments == ModelConfig.max_segments
  # the same pairs as packing without a bound, which gave rows of more than 16 documents
  docs = [text.tokenize(d, ByteTokenizer()) for d in text.TextFileSource(config.paths, unit="line")]
  rows = {}
  for bound in (None, config.max_segments):
    ds = grain.MapDataset.source(docs).to_iter_dataset()
    rows[bound] = list(pack(ds, mode=packing, seq_len=256, pad_id=ByteTokenizer.pad_id,
                            num_packing_bins=config.num_packing_bins, max_segments=bound))
  assert sequences_per_row(np.stack([r["segment_ids"] for r in rows[None]])).max() > 16
  assert sequences_per_row(np.stack([r["segment_ids"] for r in rows[16]])).max() <= 16
  assert pairs(rows[16]) == pairs(rows[None])


def test_concat_split_keeps_every_pair_once():
  docs = [np.arange(4, dtype=np.int32) + 100 * d for d in range(200)]  # 3 pairs each
  ds = grain.MapDataset.source(docs).to_iter_dataset()
  rows = list(pack(ds, mode="concat", seq_len=64, pad_id=-1, max_segments=5))
  expected = sorted((int(a), int(b)) for d in docs for a, b in zip(d[:-1], d[1:]))
  assert pairs(rows) == expected
  for row in rows:
    assert sequences_per_row(row["segment_ids"][None])[0] <= 5
    seg, pos = row["segment_ids"], row["positions"]
    for s in np.unique(seg[seg > 0]):
      idx = np.flatnonzero(seg == s)
      np.testing.assert_array_equal(np.diff(idx), 1)
      np.testing.assert_array_equal(np.diff(pos[idx]), 1)
      assert len(set((row["inputs"][idx] // 100).tolist())) == 1  # one document per segment


def test_split_rows_resume_bit_for_bit(tmp_path):
  config = text_config(short_lines(tmp_path), num_epochs=None, shuffle=True)
  it = make_dataset(config, seed=3, process_index=0, process_count=1)
  for _ in range(3):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  resumed = make_dataset(config, seed=3, process_index=0, process_count=1)
  resumed.set_state(state)
  for a in expected:
    b = next(resumed)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_row_over_the_bound_is_an_error_naming_max_segments():
  docs = [np.arange(5, dtype=np.int32)] * 3  # 4 pairs each: padded rows of 2+ sequences
  ds = grain.MapDataset.source(docs).to_iter_dataset()
  with pytest.raises(ValueError, match="more than `max_segments` = 1"):
    list(pack(ds, mode="concat", seq_len=16, pad_id=0, max_segments=1))
  row = {"segment_ids": np.array([1, 1, 2, 3, 0], np.int32)}
  assert check_segments(row, 4) is row
  with pytest.raises(ValueError, match="4 sequences .* `max_segments` = 3"):
    check_segments(row, 3)


def test_model_on_packed_short_documents_is_finite(tmp_path):
  """The issue's reproduction: rows of 3-word lines gave the jitted model NaN logits."""
  config = text_config(short_lines(tmp_path), seq_len=128, global_batch_size=2)
  batch = next(make_dataset(config, seed=0, process_index=0, process_count=1))
  model = HybridLM(tiny_config(num_layers=1, vocab_size=259), nnx.Rngs(0))
  logits = nnx.jit(lambda m, x, s: m(x, s))(model, batch["inputs"], batch["segment_ids"])
  assert np.all(np.isfinite(np.asarray(logits)))


def test_data_bound_above_the_model_bound_is_a_config_error():
  config = base_config()
  config.data.update(dict(source="text", max_segments=32))
  with pytest.raises(ValueError, match=r"config.data.max_segments=32: must be <= "
                                       r"config.model.max_segments=16"):
    validation.check_config(config)
  config.data.packing = "none"  # rows without segments: no bound to keep
  validation.check_config(config)


# ------------------------------------------------------------------------------ config ranges
def numeric_fields(config, prefix=""):
  """Dotted names of the int / float leaves of a ConfigDict tree (placeholders by their type)."""
  out = []
  for name, value in config.items():
    if hasattr(value, "items"):
      if name != "mixer_cfg":
        out += numeric_fields(value, f"{prefix}{name}.")
    elif value is None:
      if config.get_type(name) in (int, float):
        out.append(prefix + name)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      out.append(prefix + name)
  return out


def test_rules_cover_every_numeric_field():
  ruled = {field for field, _ in validation.RULES}
  assert not set(numeric_fields(base_config())) - ruled
  model_numbers = {f"model.{f.name}" for f in dataclasses.fields(ModelConfig)
                   if any(t in str(f.type) for t in ("int", "float")) and f.name != "attn_layers"}
  assert not model_numbers - ruled
  assert len(ruled) == len(validation.RULES)  # each field once


@pytest.mark.parametrize("name", ["base.py", "quickstart.py", "mqar_sweep.py"])
def test_shipped_configs_pass(name):
  from lineax_lm.train.__main__ import load_config_file
  config = load_config_file(os.path.join(ROOT, "configs", name))
  validation.check_config(config.base if "base" in config else config)


@pytest.mark.parametrize("field,value,allowed", [
    ("train.checkpoint_every", 0, "an integer >= 1"),
    ("train.log_every", 0, "an integer >= 1"),
    ("eval.every", 0, "an integer >= 1"),
    ("train.grad_accum", 0, "an integer >= 1"),
    ("model.num_layers", 0, "an integer >= 1"),
    ("train.lr", -1e-3, "a number > 0"),
    ("train.steps", -5, "an integer >= 1"),
    ("train.steps", 2.5, "an integer >= 1"),
    ("train.b2", 1.0, "a number in [0, 1)"),
    ("train.min_lr_ratio", 1.5, "a number in [0, 1]"),
    ("train.keep_checkpoints", -1, "an integer >= 1, or 0 (keep every step)"),
    ("train.restore_step", -2, "an integer >= 0, or -1 (the latest checkpoint)"),
    ("data.seq_len", 0, "an integer >= 1"),
    ("data.num_epochs", 0, "an integer >= 1, or None"),
    ("model.norm_eps", float("nan"), "a number > 0"),
    ("mesh.fsdp", 0, "an integer >= 1, or -1 (all remaining devices)"),
])
def test_out_of_range_fields_fail_before_compiling(field, value, allowed):
  from lineax_lm import sharding
  from lineax_lm.train.trainer import validate_config
  config = base_config()
  *parents, key = field.split(".")
  section = config
  for p in parents:
    section = section[p]
  with section.ignore_type():
    section[key] = value
  message = rf"config\.{field}={value!r}: must be {allowed}".replace("(", r"\(").replace(")", r"\)")
  message = message.replace("[", r"\[")
  with pytest.raises(ValueError, match=message):
    validation.check_config(config)
  if field.startswith("mesh"):  # train_and_evaluate builds the mesh first: it checks its sizes
    with pytest.raises(ValueError, match=message):
      sharding.make_mesh(config.mesh)
  else:  # through the trainer's own check, before any compile
    with pytest.raises(ValueError, match=message):
      validate_config(config, sharding.make_mesh(config.mesh))


def test_every_bad_field_is_listed_at_once():
  config = base_config()
  config.train.update(dict(log_every=0, lr=-1.0))
  config.eval.every = 0
  with pytest.raises(ValueError) as e:
    validation.check_config(config)
  for text_ in ("config.train.log_every=0", "config.train.lr=-1.0", "config.eval.every=0"):
    assert text_ in str(e.value)


@pytest.mark.parametrize("fields,message", [
    (dict(vocab_size=0), r"ModelConfig.vocab_size=0: must be an integer >= 1"),
    (dict(rope_theta=float("nan")), r"ModelConfig.rope_theta=nan: must be a number > 0"),
    (dict(dtype="bf17"), r"ModelConfig.dtype='bf17': must be a floating-point dtype name"),
    (dict(heads=3, attn_ratio="1:1"), r"ModelConfig.heads=3 does not divide hidden=32: the attention "
                                      r"layers' head size hidden // heads = 10 would use 30 of the 32"),
])
def test_model_config_built_in_python_goes_through_the_range_table(fields, message):
  with pytest.raises(ValueError, match=message):
    tiny_config(**{"kv_heads": None, **fields})
  tiny_config(heads=3, head_dim=8, kv_heads=None, attn_ratio="1:1")  # an explicit head size: fine
  tiny_config(heads=3, kv_heads=None)  # no attention layer takes its head size from `heads`


def test_warmup_longer_than_the_run_is_a_config_error():
  config = base_config()
  config.train.update(dict(steps=10, warmup_steps=100))
  with pytest.raises(ValueError, match=r"config.train.warmup_steps=100: must be <= "
                                       r"config.train.steps=10 \(the run would end at 10% of the warmup"):
    validation.check_config(config)
  config.train.warmup_steps = 10
  validation.check_config(config)


@pytest.mark.parametrize("field,value,message", [
    ("model.dtype", "bf17", "must be a floating-point dtype name: float32, bfloat16 or float16"),
    ("data.source", "mqr", "must be one of mqar, text, jsonl, parquet, tfds"),
    ("model.backend", "gpu", "this host runs jax on cpu, where the Pallas gpu kernels cannot run; "
                             "use 'auto'"),
    ("model.attn_impl", "flash", "must be one of xla, cudnn, splash"),
    ("model.attn_impl", "splash", "a TPU kernel, and this host runs jax on cpu; leave it unset"),
])
def test_string_fields_out_of_their_choices_name_the_field(field, value, message):
  config = base_config()
  section, key = field.split(".")
  config[section][key] = value
  with pytest.raises(ValueError, match=rf"config.{field}='{value}': {re.escape(message)}"):
    validation.check_config(config)


def test_a_missing_config_file_is_one_line():
  from lineax_lm.train import __main__ as cli
  with pytest.raises(SystemExit, match=r"^error: --config=/no/such.py: no such file \(give a config"):
    cli.parse_flags(["train", "--config=/no/such.py", "--workdir", "/tmp/x"])


def test_stray_positional_arguments_are_refused():
  from lineax_lm.train import __main__ as cli
  with pytest.raises(SystemExit, match=r"unexpected argument\(s\) \['run'\]: every argument is a "
                                       r"--flag \(quote a value that holds spaces"):
    cli.main(["train", "run"])  # what absl leaves of `--workdir runs/my run`


def test_negative_distillation_steps_name_the_stage(tmp_path):
  from lineax_lm.distill.config import distill_config
  from lineax_lm.distill.pipeline import distill
  config = distill_config("gated_deltanet", "runlocal")
  config.stages.layer.steps = -1
  with pytest.raises(ValueError, match=r"config.stages.layer.steps=-1: must be >= 0 \(the stage's "
                                       r"training steps; 0 skips it\)"):
    distill(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")  # before anything is loaded or written


def test_bools_are_not_numbers():
  assert not validation.count(1).allows(True)
  assert validation.count(1, none=True).allows(None) and not validation.count(1).allows(None)


# ------------------------------------------------------------------------------ "did you mean"
@pytest.mark.parametrize("config_arg,override,suggestion", [
    ("configs/quickstart.py:gdn", "train.stepz", "--config.train.steps"),
    ("configs/mqar_sweep.py:capacity", "base.train.stepz", "--config.base.train.steps"),
    ("configs/base.py", "train.stpes", "--config.train.steps"),
])
@pytest.mark.parametrize("form", ["equals", "space"])
def test_typo_helper_on_every_config_form(config_arg, override, suggestion, form):
  from lineax_lm.train import __main__ as cli
  path = os.path.join(ROOT, config_arg)
  flag = [f"--config={path}"] if form == "equals" else ["--config", path]
  with pytest.raises(SystemExit, match=f"did you mean {suggestion}"):
    cli.parse_flags(["train", *flag, f"--config.{override}=5", "--workdir", "/tmp/x"])


def test_typo_helper_leaves_the_config_files_own_error():
  from lineax_lm.train import __main__ as cli
  path = os.path.join(ROOT, "configs", "quickstart.py")
  # The config file's own error, in one line, not a typo hint about the override beside it.
  with pytest.raises(SystemExit, match="ValueError: quickstart variant must be one of") as e:
    cli.parse_flags(["train", f"--config={path}:nope", "--config.train.steps=5", "--workdir", "/x"])
  assert "did you mean" not in str(e.value) and "\n" not in str(e.value)
  assert cli.unknown_field_hints(["train", "--config=/no/such/file.py", "--config.a=1"]) is None


# ------------------------------------------------------------------------------ data files
def test_non_utf8_lines_name_file_line_and_offset(tmp_path):
  path = tmp_path / "bad.txt"
  path.write_bytes(b"good line\n\nsecond \xc3\xa9 fine\nthird \xff here\n")
  offset = len(b"good line\n\nsecond \xc3\xa9 fine\nthird ")
  for source in (lambda: text.TextFileSource(str(path), unit="line"),
                 lambda: text.TextFileSource(str(path), unit="file"),
                 lambda: text.JsonlSource(str(path))):
    with pytest.raises(ValueError, match=rf"bad.txt: line 4, byte offset {offset}: not valid UTF"):
      source()


def test_non_utf8_offset_across_read_blocks(tmp_path):
  """A character split between read blocks is fine; a bad byte's offset counts from the file
  start."""
  data = "é\n".encode() * 7 + b"\x80"
  path = tmp_path / "blocks.txt"
  path.write_bytes(data)
  for block in (1, 2, 3, 5, 64):
    with pytest.raises(ValueError, match=rf"line 8, byte offset {len(data) - 1}:"):
      text._check_text_file(str(path), block=block)
  path.write_bytes(data[:-1])
  text._check_text_file(str(path), block=3)


@pytest.mark.parametrize("content,message", [
    (b"", "the file is empty"),
    (b"\xef\xbb\xbf", "the file holds only a UTF-8 byte-order mark"),  # no text either
])
def test_empty_data_files(tmp_path, content, message):
  empty = tmp_path / "empty.txt"
  empty.write_bytes(content)
  with pytest.raises(ValueError, match=f"empty.txt: {message}"):
    text.TextFileSource(str(empty), unit="file")
  with pytest.raises(ValueError, match="hold no non-blank line"):
    text.TextFileSource(str(empty), unit="line")
  with pytest.raises(ValueError, match=message):  # the NaN case, now early
    make_dataset(text_config(str(empty), text_unit="file"), seed=0, process_index=0,
                 process_count=1)


def test_no_document_holds_a_byte_order_mark(tmp_path):
  path = tmp_path / "bom.txt"
  path.write_bytes(b"\xef\xbb\xbfhello\nworld\n")
  assert text.TextFileSource(str(path), unit="file")[0] == "hello\nworld\n"
  assert text.TextFileSource(str(path), unit="line")[0] == "hello"
  path.write_bytes(b'\xef\xbb\xbf{"text": "hi"}\n')
  assert text.JsonlSource(str(path))[0] == "hi"


def write_tokenizer(folder):
  import tokenizers
  from tokenizers import models
  vocab = {c: i for i, c in enumerate("abcdefgh")} | {"</s>": 8}
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, "tokenizer.json")
  tok.save(path)
  return path


def test_truncated_tokenizer_json_names_the_file(tmp_path):
  path = write_tokenizer(str(tmp_path / "tok"))
  assert load_tokenizer(path).eos_id == 8
  with open(path) as f:
    content = f.read()
  with open(path, "w") as f:
    f.write(content[:len(content) // 2])
  pattern = rf"{path} is not a readable tokenizer.json \(.*line \d+ column \d+"
  with pytest.raises(ValueError, match=pattern):
    load_tokenizer(path)
  with pytest.raises(ValueError, match=pattern):
    data_vocab_size(text_config("unused", tokenizer=path))  # what validate_config calls
  with pytest.raises(ValueError, match=pattern):
    load_tokenizer_json(path)


def test_bad_tokenizer_config_json_names_the_file(tmp_path):
  path = write_tokenizer(str(tmp_path / "tok"))
  side = tmp_path / "tok" / "tokenizer_config.json"
  side.write_text('{"eos_token": "</s>",\n "bos_token": ')
  with pytest.raises(ValueError, match=r"tokenizer_config.json is not valid JSON \(line 2, column"):
    load_tokenizer(path)
  with pytest.raises(ValueError, match=r"tokenizer_config.json is not valid JSON"):
    load_tokenizer_json(path)


def write_gguf(path):
  w = gguf.GGUFWriter(path, "llama")
  w.add_block_count(0)
  w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
  w.add_tensor("output_norm.weight", np.ones((8,), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_truncated_gguf_names_the_file(tmp_path):
  full = str(tmp_path / "full.gguf")
  write_gguf(full)
  with open(full, "rb") as f:
    data = f.read()
  gguf.GGUFReader(full)  # the untruncated file reads
  cut = str(tmp_path / "cut.gguf")
  for n in (10, 40, len(data) // 2, len(data) - 8):
    with open(cut, "wb") as f:
      f.write(data[:n])
    with pytest.raises(ValueError, match=rf"cut.gguf: a truncated or damaged GGUF file \({n} "):
      read_gguf_llama(cut)
  with open(cut, "wb") as f:
    f.write(b"PK\x03\x04" + data[4:])
  with pytest.raises(ValueError, match="cut.gguf: not a GGUF file .*byte offset 0"):
    read_gguf_llama(cut)


# ------------------------------------------------------------------------------ eval arguments
@pytest.mark.parametrize("argument,value", [
    ("--lengths", "0"), ("--lengths", "512,-4"), ("--lengths", ","), ("--mqar_lengths", "0"),
    ("--mqar_kv_pairs", "-1"), ("--efficiency_lengths", "0"), ("--num_examples", "0"),
    ("--mqar_examples", "0"), ("--batch_size", "0"), ("--max_len", "0"), ("--ppl_documents", "0"),
    ("--step", "-1"), ("--lengths", "abc"), ("--tasks", ","), ("--tasks", " "),
])
def test_eval_arguments_below_one_name_the_argument(argument, value):
  from lineax_lm.eval.__main__ import parse_args
  with pytest.raises(SystemExit) as e:
    parse_args(["--workdir", "w", f"{argument}={value}"])
  assert e.value.code.startswith(f"error: flag {argument}=") and "\n" not in e.value.code


def test_eval_functions_reject_lengths_below_one():
  from lineax_lm.eval import mqar, ruler
  with pytest.raises(ValueError, match="`seq_lens` must be one or more integers >= 1"):
    mqar.mqar_grid(None, vocab_size=64, seq_lens=[0], kv_pairs=[4])
  with pytest.raises(ValueError, match="`lengths` must be one or more integers >= 1"):
    ruler.evaluate_tasks(None, None, "niah_single", lengths=[-512])
  from lineax_lm.eval.__main__ import parse_args
  args = parse_args(["--workdir", "w", "--lengths", "64,128"])
  assert args.lengths == [64, 128] and args.efficiency_lengths == [2048, 8192, 32768]


# ------------------------------------------------------------------------------ saved models
@pytest.fixture(scope="module")
def saved_model():
  """A tiny model with attention layers whose key / value heads follow `heads` (no GQA): a changed
  head count then keeps every tensor's shape."""
  return HybridLM(tiny_config(vocab_size=259, attn_ratio="1:1", kv_heads=None), nnx.Rngs(0))


def _edit_config(folder, **fields):
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    meta = json.load(f)
  with open(path, "w") as f:
    json.dump({**meta, **fields}, f)


def test_saved_weights_with_garbage_bytes_are_refused(saved_model, tmp_path):
  folder = save_pretrained(saved_model, tmp_path / "m", tokenizer=ByteTokenizer())
  weights = tmp_path / "m" / "model.safetensors"
  data = bytearray(weights.read_bytes())
  data[len(data) // 2:len(data) // 2 + 256] = np.random.default_rng(0).bytes(256)
  weights.write_bytes(bytes(data))
  with pytest.raises(ValueError, match=rf"{weights} does not match its sha256 in "
                                       r"lineax_checksums.json: the file changed since save_pretrained"):
    from_pretrained(folder)


@pytest.mark.parametrize("field,value", [("heads", 2), ("rope_theta", 500.0)])
def test_a_config_edited_with_the_shapes_intact_is_refused(saved_model, tmp_path, field, value):
  folder = save_pretrained(saved_model, tmp_path / "m")
  _edit_config(folder, **{field: value})
  saved = getattr(saved_model.config, field)
  with pytest.raises(ValueError, match=rf"config.json does not describe the tensors in "
                                       rf"model.safetensors: {field}={value!r} \(saved with {saved!r}\)"):
    from_pretrained(folder)
  _edit_config(folder, **{field: saved}, backend="reference", remat="full")  # how it runs: allowed
  assert from_pretrained(folder).config.backend == "reference"


def test_save_into_a_non_empty_folder_needs_overwrite_and_then_removes_the_old_model(saved_model,
                                                                                    tmp_path):
  from lineax_lm.data.tokenizer import HFTokenizer
  folder = str(tmp_path / "m")
  tok = HFTokenizer(write_tokenizer(str(tmp_path / "tok")), bos_token="</s>", eos_token="</s>",
                    pad_token="</s>")
  save_pretrained(saved_model, folder, tokenizer=tok)
  (tmp_path / "m" / "README.md").write_text("notes")
  with pytest.raises(FileExistsError, match=rf"{folder} is not empty \(README.md, config.json, "
                                            r"lineax_checksums.json, model.safetensors, tokenizer"
                                            r".json\); pass overwrite=True"):
    save_pretrained(saved_model, folder, tokenizer=ByteTokenizer())
  save_pretrained(saved_model, folder, tokenizer=ByteTokenizer(), overwrite=True)
  assert sorted(os.listdir(folder)) == ["README.md", "config.json", "lineax_checksums.json",
                                        "model.safetensors"]  # no stale tokenizer.json
  assert isinstance(lineax_lm.load(folder).tokenizer, ByteTokenizer)


@pytest.mark.parametrize("content,message", [
    ("{not json", r"config.json is not valid JSON \(Expecting property name"),
    ("[1, 2]", r"config.json must hold a JSON object \(the model's config\); it holds a list"),
    (None, r"config.json does not describe a valid model: invalid model config:\n  "
           r"ModelConfig.heads='4': must be an integer >= 1"),
])
def test_a_bad_config_json_names_the_file(saved_model, tmp_path, content, message):
  folder = save_pretrained(saved_model, tmp_path / "m")
  if content is None:
    _edit_config(folder, heads="4")
  else:
    (tmp_path / "m" / "config.json").write_text(content)
  with pytest.raises(ValueError, match=rf"{tmp_path / 'm'}/{message}"):
    from_pretrained(folder)


def test_a_truncated_safetensors_file_names_the_file(saved_model, tmp_path):
  folder = save_pretrained(saved_model, tmp_path / "m")
  weights = tmp_path / "m" / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:1000])
  with pytest.raises(ValueError, match=rf"{weights} does not match its sha256"):
    from_pretrained(folder)
  os.remove(tmp_path / "m" / "lineax_checksums.json")  # a folder saved before checksums
  with pytest.raises(ValueError, match=rf"{weights} is not a readable safetensors file \(truncated"):
    from_pretrained(folder)


# ------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("bad", [259, 10**6, -1])
def test_prompt_ids_outside_the_vocabulary_are_refused(saved_model, bad):
  message = rf"must hold token ids in \[0, vocab_size=259\); got ids from {min(bad, 5)} to {max(bad, 5)}"
  with pytest.raises(ValueError, match=r"`prompt_ids` " + message):
    lineax_lm.generate(saved_model, [[5, bad]], 2, temperature=0.0)
  with pytest.raises(ValueError, match=r"`prompts\[1\]` " + message):
    lineax_lm.generate_ragged(saved_model, [[5], [5, bad]], 2, temperature=0.0)


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=float("nan")), r"`temperature` must be a finite number >= 0 \(0: greedy\); got nan"),
    (dict(temperature=1.0, rng=0), r"`rng` must be a jax.random key, e.g. jax.random.key\(0\); got int 0"),
    (dict(temperature=0.0, eos_id=300), r"`eos_id` must be a token id in \[0, vocab_size=259\); got 300"),
])
def test_bad_sampling_arguments_name_the_argument(saved_model, kwargs, message):
  for generate in (lineax_lm.generate, lineax_lm.generate_ragged):
    with pytest.raises(ValueError, match=message):
      generate(saved_model, [[1, 2]], 2, **kwargs)
  if "eos_id" not in kwargs:  # text generation takes the tokenizer's
    with pytest.raises(ValueError, match=message):
      Pretrained(saved_model, ByteTokenizer()).generate("a", 2, **kwargs)


@pytest.mark.parametrize("prompts,message", [
    (b"The cat", r"got bytes \(decode it first: prompts.decode\(\)\)"),
    (None, r"got NoneType"), (["a", None, b"b"], r"got a sequence holding NoneType, bytes"),
])
def test_text_prompts_must_be_strings(saved_model, prompts, message):
  with pytest.raises(ValueError, match=r"`prompts` must be a string or a sequence of strings; " + message):
    Pretrained(saved_model, ByteTokenizer()).generate(prompts, 2)


def test_a_generation_too_large_for_memory_is_refused_up_front(saved_model):
  from lineax_lm.models.generate import memory_limit
  limit, what = memory_limit()
  with pytest.raises(ValueError, match=rf"generating max_new_tokens={2**30} for 1 prompts \(a cache of "
                                       rf"256.0 GiB for {2**30 + 16} tokens per row, plus the token "
                                       rf"buffers\) needs 268.0 GiB, more than the {limit / 2**30:.1f} "
                                       rf"GiB of {what}"):
    lineax_lm.generate_ragged(saved_model, [[1, 2]], 2**30, temperature=0.0)


def _run_with_config(workdir, config):
  """A workdir whose checkpoint holds `config` (what eval reads first) and a small state."""
  from lineax_lm.train import checkpoint
  mngr = checkpoint.manager(workdir, async_save=False)
  checkpoint.save(mngr, 1, {"step": np.int32(1)}, config=config)
  mngr.close()
  return workdir


@pytest.mark.parametrize("extra,message", [
    ([], r"ppl measures text, and .*run trained on MQAR token ids .*: drop ppl from --tasks"),
    (["--ppl_paths", "heldout.txt"], r"ppl measures text, and .*run trained on MQAR token ids"),
])
def test_eval_ppl_on_an_mqar_run_says_why(tmp_path, extra, message):
  from lineax_lm.eval.__main__ import parse_args, run
  workdir = _run_with_config(str(tmp_path / "run"), base_config())  # data.source: mqar
  with pytest.raises(ValueError, match=message):
    run(parse_args(["--workdir", workdir, "--tasks", "ppl", *extra]))


def test_eval_lengths_too_long_for_memory_are_refused_up_front(saved_model):
  from lineax_lm.eval.__main__ import check_scoring_memory
  from lineax_lm.models.generate import memory_limit
  limit, what = memory_limit()
  with pytest.raises(ValueError, match=rf"--mqar_lengths=16777216 with --batch_size=8 \(a batch of 8 x "
                                       rf"16777216 tokens\) needs \d+\.\d GiB, more than the "
                                       rf"{limit / 2**30:.1f} GiB of {what}"):
    check_scoring_memory(saved_model, [64, 2**24], 8, "--mqar_lengths")
  check_scoring_memory(saved_model, [64], 8, "--mqar_lengths")  # fits
