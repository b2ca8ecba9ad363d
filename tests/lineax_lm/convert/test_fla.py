"""fla checkpoints in and out: import(export(model)) is exact for every fla model type lineax_lm
reads, pure and 3:1 hybrid; folders that are sharded, tied or converted by the command line load;
bad folders, tensors and options raise naming the file and the tensor or option."""
import json
import shutil

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

import lineax_lm
from lineax_lm.convert import fla
from lineax_lm.convert.__main__ import main as convert_main
from lineax_lm.models.hybrid import HybridLM
from lineax_lm.models.pretrained import _flat_params
from tests.lineax_lm.test_reliability_inputs import write_tokenizer
from tests.lineax_lm.tiny import tiny_config, tokens

# lineax_lm mixer -> fla model type; "transformer": every layer attention
MIXERS = {"gla": "gla", "gated_deltanet": "gated_deltanet", "deltanet": "delta_net", "hgrn": "hgrn",
          "hgrn2": "hgrn2", "retention": "retnet", "kda": "kda", "linear_attn": "linear_attn",
          "rwkv6": "rwkv6", "transformer": "transformer"}
CASES = [(m, r) for m in MIXERS for r in (("transformer",) if m == "transformer" else ("pure", "3:1"))]


def fla_config(mixer: str, attn_ratio: str = "pure", **kw):
  """tests' tiny config of `mixer` at 4 layers, with GLA's gate rank at fla's fixed 16, HGRN-2's
  output norm eps at fla's fixed 1e-5 and RWKV-6 in fla's RWKV-6 blocks."""
  if mixer == "rwkv6":
    kw = {"block": "rwkv6", **kw}
  config = tiny_config(mixer, num_layers=4, attn_ratio=attn_ratio, **kw)
  if mixer == "gla":
    config = config.replace(mixer_cfg=dict(num_heads=2))
  if mixer == "hgrn2":
    config = config.replace(mixer_cfg={**dict(config.mixer_cfg), "norm_eps": 1e-5})
  return config


def assert_same_params(a, b):
  pa, pb = _flat_params(a), _flat_params(b)
  assert pa.keys() == pb.keys()
  for key in pa:
    np.testing.assert_array_equal(np.asarray(pa[key]), np.asarray(pb[key]), err_msg=str(key))


@pytest.mark.parametrize("mixer,attn_ratio", CASES)
def test_import_of_export_is_exact(mixer, attn_ratio, tmp_path):
  config = fla_config(mixer, attn_ratio, window=8 if attn_ratio == "3:1" else None)
  model = HybridLM(config, nnx.Rngs(0))
  lineax_lm.save_pretrained(model, tmp_path, format="fla")
  meta = json.loads((tmp_path / "config.json").read_text())
  assert meta["model_type"] == MIXERS[mixer]
  back = lineax_lm.from_pretrained(tmp_path)  # routed to the fla reader by config.json
  assert fla._structure(back.config) == fla._structure(config)
  assert_same_params(model, back)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
  """A 3:1 Gated DeltaNet hybrid (GQA attention, RoPE base 500,000) and its fla folder."""
  model = HybridLM(fla_config("gated_deltanet", "3:1", rope_theta=5e5), nnx.Rngs(1))
  folder = tmp_path_factory.mktemp("fla_hybrid")
  fla.to_fla(model, folder)
  return model, folder


def test_export_writes_fla_names_layouts_and_attn(hybrid):
  model, folder = hybrid
  meta = json.loads((folder / "config.json").read_text())
  assert meta["architectures"] == ["GatedDeltaNetForCausalLM"]
  assert meta["attn"] == dict(layers=[3], num_heads=4, num_kv_heads=2, qkv_bias=False,
                              window_size=None, rope_theta=5e5)
  tensors = load_file(folder / "model.safetensors")
  mixer, attention = model.blocks[0].mixer, model.blocks[3].mixer
  np.testing.assert_array_equal(tensors["model.layers.0.attn.q_proj.weight"],
                                np.asarray(mixer.q_proj.kernel[...]).T)
  np.testing.assert_array_equal(tensors["model.layers.0.attn.q_conv1d.weight"][:, 0, :],
                                np.asarray(mixer.q_conv1d.weight[...]).T)
  np.testing.assert_array_equal(tensors["model.layers.0.attn.o_norm.weight"],
                                np.asarray(mixer.o_norm.weight[...]))
  np.testing.assert_array_equal(tensors["model.layers.3.attn.k_proj.weight"],
                                np.asarray(attention.k_proj.kernel[...]).T)
  np.testing.assert_array_equal(tensors["lm_head.weight"], np.asarray(model.lm_head[...]).T)
  assert "model.embeddings.weight" in tensors and "model.norm.weight" in tensors


def test_logits_of_an_imported_hybrid_are_the_models(hybrid):
  model, folder = hybrid
  x = tokens((2, 11))
  np.testing.assert_array_equal(np.asarray(fla.from_fla(folder)(x)), np.asarray(model(x)))


def test_sharded_safetensors_with_an_index_load(hybrid, tmp_path):
  model, folder = hybrid
  tensors = load_file(folder / "model.safetensors")
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  for file, part in shards.items():
    save_file({n: tensors[n] for n in part}, tmp_path / file, metadata={"format": "pt"})
  index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
  (tmp_path / fla.SAFETENSORS_INDEX).write_text(json.dumps(index))
  shutil.copy(folder / "config.json", tmp_path / "config.json")
  assert_same_params(model, fla.from_fla(tmp_path))

  del index["weight_map"][names[0]]  # a tensor a shard holds but the index does not list
  (tmp_path / fla.SAFETENSORS_INDEX).write_text(json.dumps(index))
  assert_same_params(model, fla.from_fla(tmp_path))
  index["weight_map"][names[0]] = "model-00001-of-00002.safetensors"
  save_file({n: tensors[n] for n in shards["model-00001-of-00002.safetensors"]}
            | {"model.layers.0.attn.stray": np.zeros(2, np.float32)},
            tmp_path / "model-00001-of-00002.safetensors")
  with pytest.raises(ValueError, match="tensor 'model.layers.0.attn.stray' has no place"):
    fla.from_fla(tmp_path)

  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
  (tmp_path / fla.SAFETENSORS_INDEX).write_text(json.dumps(index))
  with pytest.raises(ValueError, match="00001-of-00002.safetensors lacks tensor 'model.norm.weight'"):
    fla.from_fla(tmp_path)
  (tmp_path / "model-00001-of-00002.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="lists model-00001-of-00002.safetensors"):
    fla.from_fla(tmp_path)


def test_gated_deltanet_output_gate_activations(hybrid, tmp_path):
  model = HybridLM(fla_config("gated_deltanet", mixer_cfg=dict(
      num_heads=2, head_dim=16, output_gate_activation="sigmoid")), nnx.Rngs(0))
  fla.to_fla(model, tmp_path)
  assert json.loads((tmp_path / "config.json").read_text())["output_gate_activation"] == "sigmoid"
  back = fla.from_fla(tmp_path)
  assert back.blocks[0].mixer.o_norm.activation == "sigmoid"
  assert_same_params(model, back)
  silu = fla.from_fla(corrupt(hybrid[1], tmp_path / "silu", config={"output_gate_activation": "silu"}))
  assert silu.blocks[0].mixer.o_norm.activation == "swish"  # fla's two names of one gate


def test_tied_embeddings(tmp_path):
  model = HybridLM(fla_config("hgrn", tie_embeddings=True), nnx.Rngs(0))
  fla.to_fla(model, tmp_path)
  tensors = load_file(tmp_path / "model.safetensors")
  assert "lm_head.weight" not in tensors and "model.lower_bounds" in tensors
  assert_same_params(model, fla.from_fla(tmp_path))
  # a tied head saved anyway must equal the embedding
  save_file({**tensors, "lm_head.weight": tensors["model.embeddings.weight"] + 1},
            tmp_path / "model.safetensors")
  with pytest.raises(ValueError, match="'lm_head.weight' differs from 'model.embeddings.weight'"):
    fla.from_fla(tmp_path)


def test_command_line_converts_both_ways_with_the_tokenizer(hybrid, tmp_path, capsys):
  model, folder = hybrid
  source = tmp_path / "fla"
  shutil.copytree(folder, source)
  write_tokenizer(str(source))
  (source / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
  out = convert_main(["--from=fla", "--path", str(source), "--out", str(tmp_path / "lineax")])
  assert "special_tokens_map.json" in capsys.readouterr().out
  lm = lineax_lm.load(out)
  assert lm.tokenizer.eos_id == 8
  assert_same_params(model, lm.model)
  back = convert_main(["--to=fla", "--path", out, "--out", str(tmp_path / "fla_again")])
  assert json.loads((tmp_path / "fla_again" / "config.json").read_text())["eos_token_id"] == 8
  assert (tmp_path / "fla_again" / "special_tokens_map.json").exists()
  assert_same_params(model, fla.from_fla(back))


# ------------------------------------------------------------------------------------- bad input
def corrupt(folder, tmp_path, config=None, tensors=None):
  """A copy of fla folder `folder` with config.json fields `config` set (None values removed)
  and `tensors` given by a function of the tensors."""
  target = tmp_path / "corrupt"
  shutil.copytree(folder, target)
  if config:
    meta = json.loads((target / "config.json").read_text()) | config
    meta = {k: v for k, v in meta.items() if v is not None}
    (target / "config.json").write_text(json.dumps(meta))
  if tensors:
    weights = tensors(load_file(target / "model.safetensors"))
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
  return target


def test_a_folder_that_is_not_an_fla_checkpoint(hybrid, tmp_path):
  with pytest.raises(FileNotFoundError, match="is not an fla checkpoint: it has no config.json"):
    fla.load_fla(tmp_path)
  with pytest.raises(ValueError, match="model_type 'llama' is not an fla model type"):
    fla.load_fla(corrupt(hybrid[1], tmp_path, config={"model_type": "llama"}))
  no_weights = tmp_path / "no_weights"
  no_weights.mkdir()
  shutil.copy(hybrid[1] / "config.json", no_weights / "config.json")
  with pytest.raises(FileNotFoundError, match="no fla weights: none of model.safetensors"):
    fla.load_fla(no_weights)


@pytest.mark.parametrize("option,value,message", [
    ("num_v_heads", 4, r"num_v_heads=4 is not supported by lineax_lm \(it computes num_v_heads = "
                       r"None or `num_heads` only\)"),
    ("output_gate_activation", "relu", "output_gate_activation='relu' is not supported"),
    ("hidden_act", "powlu", "hidden_act='powlu' is not supported"),
    ("attnres_block_size", 2, "attnres_block_size=2 is not supported"),
    ("use_mystery_gate", True, r"option\(s\) \['use_mystery_gate'\] are unknown"),
])
def test_an_unsupported_option_is_named(hybrid, tmp_path, option, value, message):
  with pytest.raises(ValueError, match=message):
    fla.load_fla(corrupt(hybrid[1], tmp_path, config={option: value}))


def test_rwkv6_names_layouts_and_options(tmp_path):
  """fla's RWKV-6 names: the LayerNorm before layer 0 is layer 0's pre_norm, the channel mixing is
  `ffn`, the time mixing's low-rank projections are LerpLinear / LoRA modules, x_up one Linear."""
  model = HybridLM(fla_config("rwkv6", "3:1"), nnx.Rngs(0))
  fla.to_fla(model, tmp_path)
  meta = json.loads((tmp_path / "config.json").read_text())
  assert (meta["hidden_act"], meta["architectures"], meta["intermediate_size"]) == (
      "sqrelu", ["RWKV6ForCausalLM"], 64)
  tensors = load_file(tmp_path / "model.safetensors")
  mixer, block = model.blocks[0].mixer, model.blocks[3]
  np.testing.assert_array_equal(tensors["model.layers.0.pre_norm.bias"],
                                np.asarray(model.embed_norm.bias[...]))
  np.testing.assert_array_equal(tensors["model.layers.0.attn.x_proj.2.weight"].reshape(32, 5, 8),
                                np.asarray(mixer.x_up[...]).transpose(2, 0, 1))
  np.testing.assert_array_equal(tensors["model.layers.0.attn.w_proj.linear.lora.2.bias"],
                                np.asarray(mixer.w_proj.layers[2].bias[...]))
  np.testing.assert_array_equal(tensors["model.layers.3.attn.k_proj.weight"],  # attention: Linear
                                np.asarray(block.mixer.k_proj.kernel[...]).T)
  np.testing.assert_array_equal(tensors["model.layers.3.ffn.key.linear.weight"],
                                np.asarray(block.mlp.key.linear.kernel[...]).T)
  assert {"model.layers.3.ffn_norm.bias", "model.layers.3.ffn.receptance.mu",
          "model.norm.bias"} <= set(tensors)
  for option, value in (("norm_first", False), ("norm_bias", False), ("hidden_act", "swish")):
    with pytest.raises(ValueError, match=f"fla option {option}={value!r} is not supported"):
      fla.load_fla(corrupt(tmp_path, tmp_path / option, config={option: value}))
  with pytest.raises(ValueError, match="block is 'swiglu' here, 'rwkv6' in fla"):
    fla.config_to_fla(tiny_config("rwkv6"))
  with pytest.raises(ValueError, match="block is 'rwkv6' here, 'swiglu' in fla"):
    fla.config_to_fla(fla_config("gated_deltanet", block="rwkv6"))


def test_unsupported_attention_options_are_named(hybrid, tmp_path):
  attn = dict(layers=[3], num_heads=4, num_kv_heads=2, qkv_bias=True)
  with pytest.raises(ValueError, match="attn option qkv_bias=True is not supported"):
    fla.load_fla(corrupt(hybrid[1], tmp_path, config={"attn": attn}))
  specs = [dict(layers=[1], num_heads=4), dict(layers=[3], num_heads=2)]
  with pytest.raises(ValueError, match="`attn` specs with different settings"):
    fla.config_from_fla({"model_type": "gla", "num_hidden_layers": 4, "attn": specs})
  merged, _ = fla.config_from_fla({"model_type": "gla", "num_hidden_layers": 4,
                                   "attn": [dict(layers=[1], num_heads=4), dict(layers=[3], num_heads=4)]})
  assert merged.attention_indices == (1, 3)


def test_bad_tensors_are_named_with_their_file(hybrid, tmp_path):
  folder = hybrid[1]
  name = "model.layers.0.attn.A_log"
  with pytest.raises(ValueError, match=f"has no tensor '{name}'"):
    fla.load_fla(corrupt(folder, tmp_path / "a", tensors=lambda t: {k: v for k, v in t.items()
                                                                    if k != name}))
  with pytest.raises(ValueError, match="model.safetensors: tensor 'model.layers.0.attn.extra' has "
                                       "no place"):
    fla.load_fla(corrupt(folder, tmp_path / "b", tensors=lambda t: t | {
        "model.layers.0.attn.extra": np.zeros(3, np.float32)}))
  with pytest.raises(ValueError, match=f"model.safetensors: tensor '{name}' has dtype int32"):
    fla.load_fla(corrupt(folder, tmp_path / "c", tensors=lambda t: t | {
        name: t[name].astype(np.int32)}))
  with pytest.raises(ValueError, match=r"tensor 'model.norm.weight' has shape \(31,\); config.json's "
                                       r"model needs \(32,\)"):
    fla.load_fla(corrupt(folder, tmp_path / "d", tensors=lambda t: t | {
        "model.norm.weight": t["model.norm.weight"][:31]}))
  truncated = corrupt(folder, tmp_path / "e")
  data = (truncated / "model.safetensors").read_bytes()
  (truncated / "model.safetensors").write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
    fla.load_fla(truncated)


def test_bf16_tensors_load_as_float32(hybrid, tmp_path):
  import ml_dtypes
  model, folder = hybrid
  bf16 = corrupt(folder, tmp_path, tensors=lambda t: {k: v.astype(ml_dtypes.bfloat16)
                                                      for k, v in t.items()})
  got = _flat_params(fla.from_fla(bf16))
  for key, value in _flat_params(model).items():
    want = np.asarray(value).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got[key]), want)


def test_torch_bin_checkpoints_need_torch(hybrid, tmp_path):
  folder = corrupt(hybrid[1], tmp_path)
  (folder / "model.safetensors").unlink()
  (folder / "pytorch_model.bin").write_bytes(b"not a torch file")
  try:
    import torch  # noqa: F401
  except ImportError:
    with pytest.raises(ImportError, match="pytorch_model.bin: reading pytorch_model.*bin "
                                          "checkpoints needs torch"):
      fla.load_fla(folder)
  else:
    with pytest.raises(ValueError, match="pytorch_model.bin: not a readable torch checkpoint"):
      fla.load_fla(folder)


def test_export_refuses_what_fla_cannot_express(tmp_path):
  with pytest.raises(ValueError, match="mixer 'simple_gla' has no fla model type"):
    fla.to_fla(HybridLM(tiny_config("simple_gla"), nnx.Rngs(0)), tmp_path)
  with pytest.raises(ValueError, match="mixer option gate_low_rank_dim is 8 here, 16 in fla"):
    fla.config_to_fla(tiny_config("gla"))
  with pytest.raises(ValueError, match="mixer option norm_eps is 1e-06 here, 1e-05 in fla"):
    fla.config_to_fla(tiny_config("hgrn2", norm_eps=1e-6))
  with pytest.raises(ValueError, match="attention option use_short_conv is True here, False in fla"):
    fla.config_to_fla(fla_config("gated_deltanet", "3:1", attn_short_conv=True))
  with pytest.raises(ValueError, match="linear_mlp_hidden is 128 here, 64 in fla"):
    fla.config_to_fla(fla_config("gated_deltanet", "3:1", linear_mlp_hidden=128))
  with pytest.raises(ValueError, match="`format` must be 'lineax' or 'fla'"):
    lineax_lm.save_pretrained(HybridLM(fla_config("hgrn"), nnx.Rngs(0)), tmp_path, format="torch")


def test_the_command_names_a_bad_or_missing_flag_in_one_line(tmp_path):
  with pytest.raises(SystemExit, match=r"^error: .*--path"):
    convert_main(["--from=fla", "--out", str(tmp_path / "x")])
  with pytest.raises(SystemExit, match=r"^error: .*(from|to)"):
    convert_main(["--path", str(tmp_path), "--out", str(tmp_path / "x")])
  with pytest.raises(SystemExit, match=r"^error: .*config.json"):
    convert_main(["--from=fla", "--path", str(tmp_path), "--out", str(tmp_path / "x")])
