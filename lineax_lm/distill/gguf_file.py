"""GGUF teacher files -> Hugging Face Llama parameters (float32 numpy) and config.

A GGUF file (llama.cpp's format) holds metadata key/values and tensors, many of them block-quantised.
This module reads one with the `gguf` package, dequantises every tensor to float32 with
`gguf.quants.dequantize` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K..Q6_K;
tests check the types we rely on against hand-built blocks), undoes the row permutation that
llama.cpp's converter applies to the query and key projections, and renames tensors to the Hugging
Face Llama names, so that the result is interchangeable with a `LlamaForCausalLM` safetensors
checkpoint:

  token_embd.weight          -> model.embed_tokens.weight                 [vocab, hidden]
  blk.{i}.attn_norm.weight   -> model.layers.{i}.input_layernorm.weight   [hidden]
  blk.{i}.attn_q.weight      -> model.layers.{i}.self_attn.q_proj.weight  [heads * head_dim, hidden]
  blk.{i}.attn_k.weight      -> model.layers.{i}.self_attn.k_proj.weight  [kv_heads * head_dim, hidden]
  blk.{i}.attn_v.weight      -> model.layers.{i}.self_attn.v_proj.weight  [kv_heads * head_dim, hidden]
  blk.{i}.attn_output.weight -> model.layers.{i}.self_attn.o_proj.weight  [hidden, heads * head_dim]
  blk.{i}.ffn_norm.weight    -> model.layers.{i}.post_attention_layernorm.weight [hidden]
  blk.{i}.ffn_gate.weight    -> model.layers.{i}.mlp.gate_proj.weight     [intermediate, hidden]
  blk.{i}.ffn_up.weight      -> model.layers.{i}.mlp.up_proj.weight       [intermediate, hidden]
  blk.{i}.ffn_down.weight    -> model.layers.{i}.mlp.down_proj.weight     [hidden, intermediate]
  output_norm.weight         -> model.norm.weight                         [hidden]
  output.weight              -> lm_head.weight (absent when the embeddings are tied) [vocab, hidden]

Linear weights keep the torch layout [out_features, in_features] (y = x @ W.T). GGUF lists shapes
fastest axis first (ggml `ne`); the numpy arrays the reader yields are already row-major [rows, cols],
which is that torch layout.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from lineax_lm.extras import require

gguf = require("gguf", "reading GGUF teacher checkpoints")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
SUPPORTED_ARCHITECTURES = ("llama",)


# ----------------------------------------------------------------------------- metadata

def _field_value(field: Any) -> Any:
  """Decodes one `gguf.ReaderField` to a Python scalar, str or list (any gguf package version)."""
  types = list(field.types)
  if not types:
    raise ValueError(f"GGUF field {field.name!r} has no type")

  def one(part, vtype):
    if vtype == gguf.GGUFValueType.STRING:
      return bytes(part).decode("utf-8")
    value = part[0].item()
    if vtype == gguf.GGUFValueType.FLOAT32:  # shortest decimal that round-trips: 1e-05, not 9.99e-06
      return float(str(part[0]))
    return bool(value) if vtype == gguf.GGUFValueType.BOOL else value

  if types[0] == gguf.GGUFValueType.ARRAY:
    return [one(field.parts[i], types[-1]) for i in field.data]
  return one(field.parts[field.data[0]], types[0])


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
  """All key/values of a GGUF file as plain Python values (long arrays become lists)."""
  return {name: _field_value(field) for name, field in reader.fields.items()
          if not name.startswith("GGUF.")}


# ----------------------------------------------------------------------------- tensors

def dequantize(data: np.ndarray, qtype: gguf.GGMLQuantizationType | int | str) -> np.ndarray:
  """Block-quantised GGUF tensor data -> float32 array.

  Args:
    data: the tensor as `GGUFReader` yields it: float32/float16 for F32/F16, otherwise uint8 of
      shape [..., n_blocks_per_row * type_size].
    qtype: the ggml type (enum, its int value or its name such as "Q4_1").
  Returns:
    float32 array of shape [..., n_blocks_per_row * block_size] (a fresh copy, never a memmap view).
  """
  try:
    if isinstance(qtype, str):
      qtype = gguf.GGMLQuantizationType[qtype]
    qtype = gguf.GGMLQuantizationType(qtype)
  except (KeyError, ValueError) as e:
    raise ValueError(f"qtype: unknown GGML tensor type {qtype!r}") from e
  try:
    out = gguf.quants.dequantize(np.asarray(data), qtype)
  except NotImplementedError as e:
    raise ValueError(f"qtype: the gguf package cannot dequantise {qtype.name} tensors") from e
  return np.array(out, dtype=np.float32, copy=True)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Hugging Face q/k projection rows -> llama.cpp's order (what its converter writes).

  Within each head, HF's rotary pairs row j with row j + head_dim/2 (rotate_half); ggml pairs rows
  2j and 2j+1. `permute_qk` maps HF row h*hd + s*hd/2 + j to GGUF row h*hd + 2j + s.

  Args:
    w: [n_heads * head_dim, ...] (a weight [out, in] or a bias [out]).
    n_heads: heads of this projection (attention heads for q, key/value heads for k).
  """
  return _swap_head_halves(w, n_heads, (2, -1))


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of `permute_qk`: GGUF q/k rows -> Hugging Face order. Shapes as in `permute_qk`."""
  return _swap_head_halves(w, n_heads, (-1, 2))


def _swap_head_halves(w: np.ndarray, n_heads: int, split: tuple[int, int]) -> np.ndarray:
  if n_heads <= 0 or w.shape[0] % (2 * n_heads):
    raise ValueError(f"n_heads: {w.shape[0]} rows do not split into {n_heads} heads of even size")
  half = w.shape[0] // n_heads // 2
  a, b = (half if s == -1 else s for s in split)
  return np.ascontiguousarray(
      w.reshape(n_heads, a, b, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def hf_name(gguf_name: str) -> str:
  """GGUF tensor name -> Hugging Face Llama name (ValueError for names a Llama file never has)."""
  stem, dot, suffix = gguf_name.rpartition(".")
  if not dot or suffix not in ("weight", "bias"):
    raise ValueError(f"gguf_name: unexpected tensor name {gguf_name!r}")
  if stem in _GLOBAL_NAMES:
    return f"{_GLOBAL_NAMES[stem]}.{suffix}"
  parts = stem.split(".")
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
    return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{suffix}"
  raise ValueError(f"gguf_name: tensor {gguf_name!r} has no Hugging Face Llama counterpart "
                   f"(known: {sorted(_GLOBAL_NAMES)} and blk.N.{{{', '.join(_LAYER_NAMES)}}})")


# ----------------------------------------------------------------------------- config

def llama_config(metadata: dict[str, Any], *, vocab_size: int, tied: bool) -> dict[str, Any]:
  """GGUF metadata -> the Hugging Face LlamaConfig fields (a plain dict, config.json style)."""
  arch = metadata.get("general.architecture")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"general.architecture: {arch!r} is not supported (supported: "
                     f"{SUPPORTED_ARCHITECTURES})")

  def get(key, default=None):
    value = metadata.get(f"{arch}.{key}", default)
    if value is None:
      raise ValueError(f"metadata: GGUF file lacks the key {arch}.{key}")
    return value

  scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
  if scaling not in ("none", None):
    raise ValueError(f"{arch}.rope.scaling.type: rope scaling {scaling!r} is not supported")
  hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(metadata.get(f"{arch}.attention.key_length", hidden // heads))
  rot = int(metadata.get(f"{arch}.rope.dimension_count", head_dim))
  if rot != head_dim:
    raise ValueError(f"{arch}.rope.dimension_count: partial rotary ({rot} of {head_dim}) "
                     "is not a Llama configuration")
  tok = "tokenizer.ggml."
  eos = metadata.get(tok + "eos_token_id")
  return {
      "architectures": ["LlamaForCausalLM"],
      "model_type": "llama",
      "hidden_size": hidden,
      "intermediate_size": int(get("feed_forward_length")),
      "num_hidden_layers": int(get("block_count")),
      "num_attention_heads": heads,
      "num_key_value_heads": int(get("attention.head_count_kv", heads)),
      "head_dim": head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
      "rope_theta": float(get("rope.freq_base", 10000.0)),
      "rope_scaling": None,
      "vocab_size": int(vocab_size),
      "max_position_embeddings": int(get("context_length")),
      "tie_word_embeddings": bool(tied),
      "attention_bias": False,
      "mlp_bias": False,
      "bos_token_id": metadata.get(tok + "bos_token_id"),
      "eos_token_id": eos,
      "pad_token_id": metadata.get(tok + "padding_token_id", eos),
  }


# ----------------------------------------------------------------------------- whole file

GGUF_MAGIC = gguf.GGUF_MAGIC.to_bytes(4, "little")  # b"GGUF", the first bytes of every GGUF file


def open_gguf(path: str) -> gguf.GGUFReader:
  """A `gguf.GGUFReader` of `path`, or a ValueError that names the file and what is wrong with it.

  The reader itself fails on a truncated or damaged file with numpy errors ("When changing to a
  larger dtype ...", "cannot reshape array ...") that name neither the file nor the problem."""
  if not os.path.isfile(path):
    raise ValueError(f"path: no GGUF file at {path!r}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    magic = f.read(len(GGUF_MAGIC))
  if magic != GGUF_MAGIC:
    raise ValueError(f"{path}: not a GGUF file (byte offset 0: {magic!r}, expected the magic "
                     f"{GGUF_MAGIC!r}; {size} bytes)")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # numpy / index errors from reading past the end of the bytes
    raise ValueError(f"{path}: a truncated or damaged GGUF file ({size} bytes): its header, "
                     f"metadata or tensor data do not parse (the gguf reader said "
                     f"{type(e).__name__}: {e})") from None


def read_gguf_llama(path: str | os.PathLike[str]
                    ) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, str], dict[str, Any]]:
  """Reads a Llama-architecture GGUF file into Hugging Face form.

  Returns:
    config: Hugging Face LlamaConfig fields (see `llama_config`).
    params: HF name -> float32 array in HF layout (q/k rows un-permuted; no `lm_head.weight` when
      the embeddings are tied, i.e. the file has no `output.weight`).
    tensor_types: HF name -> the GGML type it was stored as ("Q4_1", "F32", ...).
    metadata: every GGUF key/value (tokenizer.* included) as Python values.
  """
  path = os.fspath(path)
  reader = open_gguf(path)
  metadata = read_metadata(reader)
  params, tensor_types = {}, {}
  for t in reader.tensors:
    name = hf_name(t.name)
    params[name] = dequantize(t.data, t.tensor_type)
    tensor_types[name] = t.tensor_type.name
  if "model.embed_tokens.weight" not in params:
    raise ValueError(f"path: {path!r} has no token_embd.weight tensor")
  config = llama_config(metadata, vocab_size=params["model.embed_tokens.weight"].shape[0],
                        tied="lm_head.weight" not in params)
  for i in range(config["num_hidden_layers"]):
    for proj, heads in (("q_proj", config["num_attention_heads"]),
                        ("k_proj", config["num_key_value_heads"])):
      key = f"model.layers.{i}.self_attn.{proj}.weight"
      if key in params:
        params[key] = unpermute_qk(params[key], heads)
  check_llama_params(config, params, source=path)
  return config, params, tensor_types, metadata


def llama_param_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
  """The HF Llama parameter names and shapes a config implies (lm_head only when untied)."""
  d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
  hd = config.get("head_dim") or d // config["num_attention_heads"]
  q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  if not config.get("tie_word_embeddings", False):
    shapes["lm_head.weight"] = (v, d)
  per_layer = {"input_layernorm": (d,), "post_attention_layernorm": (d,),
               "self_attn.q_proj": (q, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d),
               "self_attn.o_proj": (d, q), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d),
               "mlp.down_proj": (d, f)}
  for i in range(config["num_hidden_layers"]):
    for name, shape in per_layer.items():
      shapes[f"model.layers.{i}.{name}.weight"] = shape
  return shapes


def check_llama_params(config: dict[str, Any], params: dict[str, np.ndarray], *, source: str) -> None:
  """ValueError unless `params` has exactly the config's Llama weights with the right shapes."""
  expected = llama_param_shapes(config)
  missing = sorted(set(expected) - set(params))
  extra = sorted(set(params) - set(expected))
  bad = [f"{k}: {params[k].shape} != {s}" for k, s in expected.items()
         if k in params and tuple(params[k].shape) != s]
  if missing or extra or bad:
    raise ValueError(f"{source}: not a Llama checkpoint matching its config: missing {missing[:6]}"
                     f"{'...' if len(missing) > 6 else ''}, unexpected {extra[:6]}, "
                     f"wrong shapes {bad[:6]}")
