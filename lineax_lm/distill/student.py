"""Students: the teacher's network with linear token mixers, initialised from the teacher.

    scfg = student_config(teacher_cfg, "gated_deltanet", attn_ratio="3:1")
    student = init_student(teacher, scfg, seed=0)          # HybridLM

What is copied (teacher Llama -> student; H heads of head dim d, Hkv key/value heads):
  embeddings, final norm, LM head (tied or not), every block's two RMSNorms and SwiGLU MLP: copied.
  attention layers of a hybrid student (`attn_ratio` "r:1"): the teacher's attention, exactly.
  linear layers: the teacher's attention projections where the mixer has a projection of that role
  and shape (k and v: the Hkv grouped heads repeated to H full heads, as HF's repeat_kv does):

  | mixer          | q_proj | k_proj | v_proj | o_proj | freshly initialised                        |
  |----------------|--------|--------|--------|--------|--------------------------------------------|
  | gated_deltanet | q      | k      | v      | o      | convs, a/b_proj, A_log, dt_bias, g_proj, o_norm |
  | gla            | q      | k      | v      | o      | gk_proj (gate), g_proj, o_norm             |
  | deltanet       | q      | k      | v      | o      | convs, b_proj, o_norm                      |
  | retention      | q      | k      | v      | o      | g_proj, o_norm (RoPE theta = the teacher's) |
  | kda            | q      | k      | v      | o      | convs, f_proj, b_proj, A_log, dt_bias, g_proj, o_norm |
  | linear_attn    | q      | k      | v      | o      | feature maps (Hadamard), o_norm            |
  | mlstm          | -      | -      | v -> proj_up's mLSTM half, v_proj = I | o -> proj_down | q/k (block-diagonal), z half of proj_up, gates, conv, o_norm, skip |
  | mlstm, qkv_proj="dense" | q | k | v | o -> proj_down | proj_up (z and the skip branch), gates, conv, o_norm, skip |

mLSTM's q and k are block-diagonal maps of the convolved up-projection (xLSTM's layout), which no
dense teacher projection fits: only its value path and output map take the teacher's weights. The
dense variant (`mixer_cfg.qkv_proj="dense"`, the study's `mlstm_dense` student) projects q/k/v from
the layer input as attention does, so it inherits all four projections like the other students.
The student mixer configs (`STUDENT_MIXER_CFG`) make these shapes match: H heads of head dim d and
value dim d (expand_k = expand_v = H d / D where the mixer sizes by ratios; mLSTM's inner width H d).
Short convolutions start as the identity (`conv_init="identity"`: the current-token tap 1, the
others 0), so q/k/v start as the teacher's projections (then SiLU, as the fla layers apply);
`conv_init="random"` keeps fla's normal(0.02) taps. An output RMSNorm without a gate (DeltaNet,
linear attention) starts with weight 0 (`output_norm_init="zeros"`): it scales every head's output
to unit RMS, far larger than the teacher's attention output at most layers (at SmolLM2's layer 0
the weight-1 norm starts the stage-1 loss at 442 times the target's mean square), and at stage 1's lr
the weights cannot shrink that in its steps; from 0 the mixer starts as the zero output, as the
gated students nearly do (swish of a small g_proj), and learns its scale
(lineax_lm.distill.ablation measures it). `output_norm_init="ones"` keeps fla's init. Everything
else keeps the layer's fla init.
"""
from __future__ import annotations

import numpy as np
from flax import nnx

from lineax_lm.distill.teacher import with_values
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import HybridLM, init_model

# mixer -> its config overrides, as a function of (heads H, head dim d, width D, rope theta).
STUDENT_MIXER_CFG = {
    "gated_deltanet": lambda H, d, D, theta: dict(num_heads=H, head_dim=d, expand_v=1.0),
    "kda": lambda H, d, D, theta: dict(num_heads=H, head_dim=d, expand_v=1.0),
    "gla": lambda H, d, D, theta: dict(num_heads=H, expand_k=H * d / D, expand_v=H * d / D),
    "deltanet": lambda H, d, D, theta: dict(num_heads=H, expand_k=H * d / D, expand_v=H * d / D),
    "retention": lambda H, d, D, theta: dict(num_heads=H, expand_k=H * d / D, expand_v=H * d / D,
                                             rope_theta=theta),
    "linear_attn": lambda H, d, D, theta: dict(num_heads=H, expand_k=H * d / D, expand_v=H * d / D),
    "mlstm": lambda H, d, D, theta: dict(num_heads=H, proj_factor=H * d / D, round_to=d),
}
_QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
CONV_INITS = ("identity", "random")
OUTPUT_NORM_INITS = ("zeros", "ones")


def student_config(teacher_cfg: ModelConfig, mixer: str, attn_ratio: str = "pure",
                   mixer_cfg: dict | None = None, attn_layers=None, **overrides) -> ModelConfig:
  """The teacher's ModelConfig with `mixer` in its linear layers (placed by `attn_ratio` /
  `attn_layers`), sized so that the teacher's projections map (STUDENT_MIXER_CFG); `mixer_cfg`
  adds or overrides mixer options, `overrides` other ModelConfig fields."""
  if mixer not in STUDENT_MIXER_CFG:
    raise ValueError(f"mixer: {mixer!r} has no teacher mapping; choose one of {sorted(STUDENT_MIXER_CFG)}")
  D, H = teacher_cfg.hidden, teacher_cfg.heads
  d = teacher_cfg.head_dim or D // H
  cfg = {**STUDENT_MIXER_CFG[mixer](H, d, D, teacher_cfg.rope_theta), **dict(mixer_cfg or {})}
  return teacher_cfg.replace(mixer=mixer, mixer_cfg=cfg, attn_ratio=attn_ratio,
                             attn_layers=attn_layers, **overrides)


def repeat_kv(w: np.ndarray, kv_heads: int, heads: int) -> np.ndarray:
  """A grouped [kv_heads * d, D] projection (HF layout) -> [heads * d, D], kv head j serving query
  heads j * r .. (j + 1) * r - 1 (r = heads / kv_heads), as HF's repeat_kv."""
  d = w.shape[0] // kv_heads
  return np.repeat(w.reshape(kv_heads, d, -1), heads // kv_heads, axis=0).reshape(heads * d, -1)


def _attention_weights(teacher: HybridLM, i: int) -> dict[str, np.ndarray]:
  """Layer i's q/k/v/o as HF [out, in] float32 numpy, k and v repeated to full heads."""
  cfg = teacher.config
  mixer = teacher.blocks[i].mixer
  w = {n: np.asarray(getattr(mixer, n).kernel[...], np.float32).T for n in _QKVO}
  for n in ("k_proj", "v_proj"):
    w[n] = repeat_kv(w[n], cfg.kv_heads or cfg.heads, cfg.heads)
  return w


def _identity_convs(mixer, prefix: tuple) -> dict:
  out = {}
  for name in getattr(mixer, "conv_names", ()):
    conv = getattr(mixer, f"{name}_conv1d")
    weight = np.zeros(conv.weight.shape, np.float32)
    weight[-1] = 1.0
    out[prefix + (f"{name}_conv1d", "weight")] = weight
  return out


def _linear_mixer_values(mixer_name: str, mixer, w: dict, prefix: tuple) -> dict:
  """The student mixer's parameters taken from the teacher's attention weights `w` (HF layout)."""
  def put(name, value):
    have = tuple(getattr(mixer, name).kernel.shape)
    if have != value.shape:
      raise ValueError(f"mixer_cfg: the {mixer_name} student's {name} is {have}, the teacher's "
                       f"projection {value.shape}; keep STUDENT_MIXER_CFG's head sizes")
    return {prefix + (name, "kernel"): value}
  if mixer_name == "mlstm" and mixer.cfg.qkv_proj == "dense":
    if w["v_proj"].shape[0] != mixer.inner:
      raise ValueError(f"mixer_cfg: the mlstm student's inner width {mixer.inner} differs from the "
                       f"teacher's {w['v_proj'].shape[0]} attention channels")
    out = {}
    for name in ("q_proj", "k_proj", "v_proj"):
      out.update(put(name, w[name].T))
    return {**out, **put("proj_down", w["o_proj"].T)}
  if mixer_name == "mlstm":
    inner = mixer.inner
    if w["v_proj"].shape[0] != inner:
      raise ValueError(f"mixer_cfg: the mlstm student's inner width {inner} differs from the "
                       f"teacher's {w['v_proj'].shape[0]} attention channels")
    up = np.asarray(mixer.proj_up.kernel[...], np.float32).copy()
    up[:, :inner] = w["v_proj"].T
    blocks = mixer.v_proj.weight.shape
    return {prefix + ("proj_up", "kernel"): up,
            prefix + ("v_proj", "weight"): np.broadcast_to(np.eye(blocks[1], dtype=np.float32), blocks),
            **put("proj_down", w["o_proj"].T)}
  out = {}
  for name in _QKVO:
    out.update(put(name, w[name].T))
  return out


def _ungated_output_norm(mixer, prefix: tuple) -> dict:
  """The zero weight of `mixer`'s output RMSNorm when no gate scales it (none otherwise)."""
  if getattr(mixer, "g_proj", True) is not None or not hasattr(mixer, "o_norm"):
    return {}
  return {prefix + ("o_norm", "weight"): np.zeros(mixer.o_norm.weight.shape, np.float32)}


def init_student(teacher: HybridLM, config: ModelConfig, *, seed: int = 0,
                 conv_init: str = "identity", output_norm_init: str = "zeros") -> HybridLM:
  """A student HybridLM of `config` (see `student_config`) initialised from `teacher` (module
  docstring). The teacher is not changed."""
  if conv_init not in CONV_INITS:
    raise ValueError(f"conv_init: must be one of {CONV_INITS}; got {conv_init!r}")
  if output_norm_init not in OUTPUT_NORM_INITS:
    raise ValueError(f"output_norm_init: must be one of {OUTPUT_NORM_INITS}; got {output_norm_init!r}")
  tc = teacher.config
  for field in ("vocab_size", "num_layers", "hidden", "heads", "kv_heads", "head_dim", "mlp_hidden",
                "tie_embeddings", "rope_theta"):
    if getattr(tc, field) != getattr(config, field):
      raise ValueError(f"config.{field}: the student has {getattr(config, field)!r}, the teacher "
                       f"{getattr(tc, field)!r}; build the student with student_config(teacher.config, ...)")
  if config.linear_mlp_hidden not in (None, tc.mlp_hidden):
    raise ValueError("config.linear_mlp_hidden: the student's MLPs are the teacher's; leave it None")
  student = init_model(config, seed)
  values = {}
  for path, var in nnx.to_flat_state(nnx.state(teacher, nnx.Param)):
    if path[0] != "blocks" or path[2] != "mixer" or student.blocks[path[1]].is_attention:
      values[path] = np.asarray(var[...])
  for i, block in enumerate(student.blocks):
    if block.is_attention:
      continue
    prefix = ("blocks", i, "mixer")
    values.update(_linear_mixer_values(config.mixer, block.mixer, _attention_weights(teacher, i), prefix))
    if conv_init == "identity":
      values.update(_identity_convs(block.mixer, prefix))
    if output_norm_init == "zeros":
      values.update(_ungated_output_norm(block.mixer, prefix))
  return with_values(student, values)


def linear_layers(config: ModelConfig) -> tuple:
  """Indices of the linear (non-attention) layers."""
  attention = set(config.attention_indices)
  return tuple(i for i in range(config.num_layers) if i not in attention)

