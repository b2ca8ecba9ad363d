"""Pieces every layer shares: parameters with logical axis names, norms, short convolution, RoPE,
the SwiGLU MLP, packed-sequence bookkeeping and the chunk/recurrent op call.

Shape legend: B batch, L time, D hidden (model width), H heads, K key head dim, V value head dim,
C channels of a projection, W short-convolution width, N packed sequences.

Logical axis names of the parameters (mapped to mesh axes by the training loop's rules):
  "vocab"   vocabulary                      "embed"    model width D
  "heads"   head-major projection width     "kv_heads" attention key/value projection width
  "mlp"     SwiGLU hidden width             "lowrank"  low-rank bottleneck of a gate
  "conv"    short-convolution taps          "norm"     norm weights and biases
  "layers"  per-layer rows (HGRN lower bounds); per-head scalars (A_log, dt_bias, ...) use None.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from lineax_lm import sharding

F32 = jnp.float32
INIT_STD = 0.02  # fla / HF Llama initializer_range: normal(0, 0.02) for linears, convs, embeddings


@dataclasses.dataclass(frozen=True)
class MixerConfig:
  """Options every mixer layer shares. `backend` is the op backend ("auto" | "reference" | "xla" |
  "gpu" | "tpu"); tests force "xla". Subclasses add the layer's own options with fla's defaults."""
  backend: str = "auto"
  norm_eps: float = 1e-5
  use_short_conv: bool = True
  conv_size: int = 4
  conv_bias: bool = False


class LayerSpec(NamedTuple):
  """Construction arguments every layer receives from the model."""
  hidden: int
  dtype: Any = F32          # activation / compute dtype
  param_dtype: Any = F32
  init_std: float = INIT_STD
  residual_scale: float = 1.0  # init_std's factor for the projections into the residual stream


def param(rngs, init, shape, axes, dtype=F32):
  """An nnx.Param initialised with `init(key, shape, dtype)` carrying logical axis names `axes`."""
  return nnx.Param(init(rngs.params(), shape, dtype), sharding=axes, eager_sharding=False)


def dense(din: int, dout: int, axes, spec: LayerSpec, rngs, *, bias: bool = False,
          kernel_init=None):
  """A bias-free (by default) nnx.Linear with normal(init_std) weights and logical axis names."""
  init = kernel_init or nnx.initializers.normal(spec.init_std)
  return nnx.Linear(
      din, dout, use_bias=bias, dtype=spec.dtype, param_dtype=spec.param_dtype, rngs=rngs,
      kernel_init=nnx.with_partitioning(init, axes, eager_sharding=False),
      bias_init=nnx.with_partitioning(nnx.initializers.zeros, (axes[-1],), eager_sharding=False))


def residual_dense(din: int, dout: int, axes, spec: LayerSpec, rngs):
  """The projection that writes a branch (a mixer's or an MLP's output) into the residual stream:
  `dense` with normal(spec.init_std * spec.residual_scale) weights (ModelConfig.residual_init)."""
  init = nnx.initializers.normal(spec.init_std * spec.residual_scale)
  return dense(din, dout, axes, spec, rngs, kernel_init=init)


def split_heads(x, head_dim: int):
  """[B, L, H * head_dim] -> [B, L, H, head_dim]."""
  return x.reshape(*x.shape[:-1], x.shape[-1] // head_dim, head_dim)


def merge_heads(x):
  return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def check_expand(name: str, head_dim: int, expand_v: float) -> int:
  """head_dim * expand_v, which must be an integer (the value head dim)."""
  if not math.isclose(head_dim * expand_v, round(head_dim * expand_v)):
    raise ValueError(f"{name}: `expand_v` = {expand_v} times `head_dim` = {head_dim} must be an "
                     "integer")
  return round(head_dim * expand_v)


def recomputed(fn):
  """`fn` under jax.checkpoint saving nothing: for the elementwise float32 math around bf16
  activations (norms, short convolutions), whose autodiff residuals are otherwise float32 copies
  [B, L, C] of inputs and intermediates (a short convolution left 4 upcast taps, their sum and two
  SiLU terms); the backward recomputes them from the activation-dtype inputs in one fused pass,
  so only those inputs are kept."""
  return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)


def recomputed_between_dots(fn):
  """`fn` under jax.checkpoint saving only matmul outputs: the elementwise work between a layer's
  projections and its op (convolutions, norms, activations) is recomputed in the backward from
  the projections' outputs, and its intermediates are not kept."""
  return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_saveable)


# ----------------------------------------------------------------------------------------- norms
def _rms(x, eps):
  x = x.astype(F32)
  return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
  """x / rms(x) * weight over the last axis, computed in float32 (HF Llama / fla RMSNorm)."""

  def __init__(self, dim: int, eps: float, spec: LayerSpec, rngs):
    self.eps = eps
    self.weight = param(rngs, nnx.initializers.ones, (dim,), ("norm",), spec.param_dtype)

  def __call__(self, x):
    return recomputed(lambda x, w: (_rms(x, self.eps) * w.astype(F32)).astype(x.dtype))(
        x, self.weight[...])


class LayerNorm(nnx.Module):
  """(x - mean(x)) / std(x) * weight + bias over the last axis, computed in float32 (torch's and
  fla's LayerNorm with a bias)."""

  def __init__(self, dim: int, eps: float, spec: LayerSpec, rngs):
    self.eps = eps
    self.weight = param(rngs, nnx.initializers.ones, (dim,), ("norm",), spec.param_dtype)
    self.bias = param(rngs, nnx.initializers.zeros, (dim,), ("norm",), spec.param_dtype)

  def __call__(self, x):
    def norm(x, w, b):
      x32 = x.astype(F32)
      y = _rms(x32 - jnp.mean(x32, axis=-1, keepdims=True), self.eps)
      return (y * w.astype(F32) + b.astype(F32)).astype(x.dtype)
    return recomputed(norm)(x, self.weight[...], self.bias[...])


class GatedRMSNorm(nnx.Module):
  """fla's FusedRMSNormGated: rmsnorm(o) * weight * act(g) per head; o, g: [..., H, V]."""

  def __init__(self, dim: int, eps: float, spec: LayerSpec, rngs, activation: str = "swish"):
    if activation not in ("swish", "sigmoid"):
      raise ValueError(f"`activation` must be 'swish' or 'sigmoid'; got {activation!r}")
    self.eps, self.activation = eps, activation
    self.weight = param(rngs, nnx.initializers.ones, (dim,), ("norm",), spec.param_dtype)

  def __call__(self, o, g):
    def norm(o, g, w):
      g = g.astype(F32)
      gate = jax.nn.silu(g) if self.activation == "swish" else jax.nn.sigmoid(g)
      return (_rms(o, self.eps) * w.astype(F32) * gate).astype(o.dtype)
    return recomputed(norm)(o, g, self.weight[...])


class GroupNorm(nnx.Module):
  """fla's GroupNorm: a LayerNorm (or RMSNorm) within each of `groups` heads of x [..., groups * d],
  with a per-channel weight (and bias) over all groups * d channels."""

  def __init__(self, groups: int, dim: int, eps: float, spec: LayerSpec, rngs, *, bias: bool,
               rms: bool = False):
    self.groups, self.eps, self.rms = groups, eps, rms
    self.weight = param(rngs, nnx.initializers.ones, (dim,), ("norm",), spec.param_dtype)
    self.bias = (param(rngs, nnx.initializers.zeros, (dim,), ("norm",), spec.param_dtype) if bias
                 else None)

  def __call__(self, x):
    xg = x.astype(F32).reshape(*x.shape[:-1], self.groups, -1)
    if not self.rms:
      xg = xg - jnp.mean(xg, axis=-1, keepdims=True)
    y = _rms(xg, self.eps).reshape(x.shape) * self.weight[...].astype(F32)
    if self.bias is not None:
      y = y + self.bias[...].astype(F32)
    return y.astype(x.dtype)


# ------------------------------------------------------------------------------ packed sequences
class Packing(NamedTuple):
  """Packed rows (several sequences per row), derived once per batch from `segment_ids`, or a
  prompt padded to a compiled width (`prompt_packing`: the prompt, then its padding).

  cu_seqlens: int32 [B, N + 1] offsets of the sequences within each row, padded with L (empty
    sequences) up to a static N.
  reset_ids: int32 [B, L] index of the sequence each token belongs to (unique across the batch).

  prompt_length: int32 scalar, the prompt's tokens in every row (`prompt_packing`), else None.

  With a cache, the cache continues each row's first sequence and the later ones are a prefill's
  padding: no state or convolution input of theirs enters the new cache (run_op, causal_taps).
  """
  cu_seqlens: jax.Array
  reset_ids: jax.Array
  prompt_length: jax.Array | None = None


class Context(NamedTuple):
  """What a mixer needs besides its input: RoPE positions [B, L], packing, and the number of tokens
  already in the cache (scalar int32; attention writes its keys and values there)."""
  positions: jax.Array
  packing: Packing | None = None
  cache_index: jax.Array | None = None


def causal_taps(x, width: int, state=None, reset_ids=None):
  """taps[s][:, t] = x[:, t - s] for s = 0..width-1 (zero before the sequence or segment start).

  x: [B, L, C]; state: [B, width - 1, C], the inputs before x (decode / prefill continuation);
  reset_ids: [B, L] segment ids, a tap never crosses a change of id. Returns (taps, new_state) with
  new_state [B, width - 1, C] the last width - 1 inputs; with both `state` and `reset_ids`, the
  inputs before x continue each row's first segment, and new_state is the last width - 1 inputs of
  that segment (Packing: the later segments are padding).
  """
  B, L, C = x.shape
  prev = jnp.zeros((B, width - 1, C), x.dtype) if state is None else state.astype(x.dtype)
  xx = jnp.concatenate([prev, x], axis=1)
  if reset_ids is not None:
    # the ids of xx: the inputs before x (zeros without a state) continue the first segment
    ids = jnp.concatenate([jnp.broadcast_to(reset_ids[:, :1], (B, width - 1)), reset_ids], axis=1)
  taps = []
  for s in range(width):
    tap = xx[:, width - 1 - s: width - 1 - s + L]
    if reset_ids is not None and s > 0:
      same = ids[:, width - 1 - s: width - 1 - s + L] == reset_ids
      tap = jnp.where(same[..., None], tap, 0)
    taps.append(tap)
  if state is None or reset_ids is None:
    return taps, xx[:, L:]
  # the first segment's last width - 1 inputs: xx[n: n + width - 1], n the segment's length
  first_length = jnp.sum(reset_ids == reset_ids[:, :1], axis=1)
  last_inputs = jax.vmap(lambda row, n: lax.dynamic_slice_in_dim(row, n, width - 1))
  return taps, last_inputs(xx, first_length)


class ShortConv(nnx.Module):
  """Causal depthwise convolution of width W over time (fla's ShortConvolution), optional SiLU.

  weight [W, C]: weight[W - 1] multiplies the current token (torch Conv1d weight[c, 0, j] -> [j, c]).
  """

  def __init__(self, channels: int, width: int, spec: LayerSpec, rngs, *, bias: bool = False,
               activation: str | None = "silu"):
    if width < 1:
      raise ValueError(f"`conv_size` must be >= 1; got {width}")
    self.width, self.channels, self.activation = width, channels, activation
    self.weight = param(rngs, nnx.initializers.normal(spec.init_std), (width, channels),
                        ("conv", "heads"), spec.param_dtype)
    self.bias = (param(rngs, nnx.initializers.zeros, (channels,), ("heads",), spec.param_dtype)
                 if bias else None)

  def __call__(self, x, state=None, reset_ids=None):
    """x: [B, L, C] -> (y [B, L, C], new conv state [B, W - 1, C])."""
    def conv(x, w, bias, state):
      taps, new_state = causal_taps(x, self.width, state, reset_ids)
      y = sum(tap.astype(F32) * w.astype(F32)[self.width - 1 - s] for s, tap in enumerate(taps))
      if bias is not None:
        y = y + bias.astype(F32)
      if self.activation == "silu":
        y = jax.nn.silu(y)
      return y.astype(x.dtype), new_state
    bias = None if self.bias is None else self.bias[...]
    if state is None and self.width > 1 and sharding.context_axis(x.shape[1]):
      return context_parallel_conv(self, x, reset_ids), x[:, x.shape[1] - (self.width - 1):]
    return recomputed(conv)(x, self.weight[...], bias, state)


def context_parallel_conv(conv: ShortConv, x, reset_ids):
  """`conv`'s training output y [B, L, C] (no state) with T split over the mesh's `context` axis:
  each device receives the previous slice's last W - 1 inputs and their segment ids (a halo, one
  ppermute each; zeros on the first device, whose zero inputs add nothing), runs the layer's own
  convolution on halo + slice and keeps its slice's outputs, so a tap crosses devices exactly where
  it crosses positions and stops at the same sequence starts."""
  halo_rows = conv.width - 1
  graphdef, params = nnx.split(conv)

  def local(x, params, reset_ids):
    x = jnp.concatenate([sharding.previous_halo(x, halo_rows), x], axis=1)
    if reset_ids is not None:
      reset_ids = jnp.concatenate([sharding.previous_halo(reset_ids, halo_rows), reset_ids], axis=1)
    return nnx.merge(graphdef, params)(x, None, reset_ids)[0][:, halo_rows:]
  return sharding.context_map(local, (x, params, reset_ids), ("time", "channels", "time"), x.shape[-1])


# ----------------------------------------------------------------------------- gate initialisers
def a_log_init(lo, hi):
  """A_log = log(A), A ~ uniform(lo, hi) per head (fla's Mamba-2 style decay rates)."""
  return lambda key, shape, dtype: jnp.log(jax.random.uniform(key, shape, F32, lo, hi)
                                           .clip(1e-4)).astype(dtype)


def dt_bias_init(dt_min=1e-3, dt_max=0.1, floor=1e-4):
  """Inverse softplus of dt ~ log-uniform(dt_min, dt_max) (fla's GDN / Mamba-2 init)."""
  def init(key, shape, dtype):
    u = jax.random.uniform(key, shape, F32)
    dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)), floor)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)
  return init


# ------------------------------------------------------------------------------------------ RoPE
def rope(x, positions, theta: float):
  """Rotary embedding in HF Llama's rotate-half layout. x: [B, L, H, D]; positions: [B, L]."""
  D = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, D, 2, dtype=F32) / D))              # [D/2]
  ang = positions.astype(F32)[..., None] * inv_freq                             # [B, L, D/2]
  cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(F32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


# ------------------------------------------------------------------------------------------- MLP
def mlp_width(hidden: int, ratio: float = 4.0, multiple: int = 256) -> int:
  """fla's GatedMLP rule: int(hidden * ratio * 2 / 3) rounded up to a multiple of 256."""
  n = int(hidden * ratio * 2 / 3)
  return multiple * ((n + multiple - 1) // multiple)


class SwiGLU(nnx.Module):
  """down_proj(silu(gate_proj(x)) * up_proj(x)); the names of HF Llama's MLP."""

  def __init__(self, hidden: int, width: int, spec: LayerSpec, rngs):
    self.gate_proj = dense(hidden, width, ("embed", "mlp"), spec, rngs)
    self.up_proj = dense(hidden, width, ("embed", "mlp"), spec, rngs)
    self.down_proj = residual_dense(width, hidden, ("mlp", "embed"), spec, rngs)

  def __call__(self, x):
    # The product is recomputed in the backward (one elementwise pass) instead of being kept for
    # down_proj's weight gradient beside the gate and up activations it is made of: B=8, T=4096,
    # width 2,816 in bf16 is 184 MB a layer.
    return self.down_proj(recomputed(_swiglu)(self.gate_proj(x), self.up_proj(x)))


def _swiglu(gate, up):
  return jax.nn.silu(gate) * up


# -------------------------------------------------------------------------------------- op calls
def cu_seqlens_from_starts(starts, n: int):
  """starts: bool [T] (True where a sequence begins; starts[0] True) -> int32 [n + 1] offsets, padded
  with T (empty sequences) when there are fewer than n sequences."""
  T = starts.shape[0]
  offsets = jnp.nonzero(starts, size=n, fill_value=T)[0]
  return jnp.concatenate([offsets, jnp.array([T])]).astype(jnp.int32)


def prompt_packing(length, batch: int, width: int) -> Packing:
  """The Packing of `batch` rows of `width` tokens whose first `length` (an int32 scalar) are a
  prompt and the rest its padding: two sequences a row, ids unique across the batch."""
  length = jnp.asarray(length, jnp.int32)
  cu_seqlens = jnp.broadcast_to(jnp.stack([0, length, width]).astype(jnp.int32), (batch, 3))
  padding = (jnp.arange(width, dtype=jnp.int32) >= length).astype(jnp.int32)
  return Packing(cu_seqlens, 2 * jnp.arange(batch, dtype=jnp.int32)[:, None] + padding, length)


def run_op(chunk_fn, recurrent_fn, args: tuple, *, state=None, decode: bool = False, packing=None,
           neutral: dict[int, float] | None = None, **kwargs):
  """Calls a pallas_kernels op on time-major args ([B, L, ...] arrays).

  Training (state None): the chunk op, no final state. Prefill (state given): the chunk op from
  `state`, returning the final state. Decode (`decode` True): the fused_recurrent op from `state`.
  Packed rows: each row runs as a B == 1 op call with its own `packing.cu_seqlens` (vmapped over the
  rows), so the state resets at every sequence boundary. Rows stay independent: flattening the batch
  into one row would make the sequential pass over chunks B times longer. Packed rows with a state
  (a prompt padded to a compiled width, Packing): the row's state starts its first sequence, the
  later ones (the padding) start from zeros, and the final state is its first sequence's.
  `neutral` ({index into args: value}) names inputs whose value at a token leaves the state as it
  is (a log-gate of 0 with a key or beta of 0): with it, a prompt padded to a compiled width
  (`prompt_packing`) runs as one call over the batch and the whole width, its padding set to those
  values, so the final state is the prompt's. Nothing reads the padding's outputs: the layers after
  see them only at the padding's positions. That call takes the op's plain path, where the packed
  one runs each row as a varlen call under a vmap (the 475M GDN's prefill of 64 x 2,048 tokens on
  an H100: 400 against 462 ms, 5.1 against 27.9 GiB of XLA temporaries). Array
  keyword arguments are per-head ([H, ...], e.g. RWKV-6's u). Returns (o [B, L, ...], final state
  or None).

  Under a mesh with the training axes, the op runs inside `jax.shard_map` (`sharding.shard_op`);
  when that mesh splits T over `context` (training only), the chunk op gets `context_axis` and
  each row's global cu_seqlens.
  """
  fn = recurrent_fn if decode else chunk_fn
  arrays = {n: v for n, v in kwargs.items() if isinstance(v, jax.Array)}
  static = {n: v for n, v in kwargs.items() if n not in arrays}

  def call(args, state, arrays, cu_seqlens, context_axis=None):
    # context_axis: each device holds one slice of T; the op passes the state between slices
    split = {} if context_axis is None else {"context_axis": context_axis}
    if cu_seqlens is None:
      return fn(*args, initial_state=state, output_final_state=state is not None, **arrays, **static,
                **split)

    def row(row_args, row_cu, row_state):
      # the op's state has one entry per sequence of the row: the row's own for the first
      first = None if row_state is None else jax.tree.map(
          lambda s: jnp.zeros((row_cu.shape[0] - 1, *s.shape), s.dtype).at[0].set(s), row_state)
      o, final = fn(*(a[None] for a in row_args), cu_seqlens=row_cu, initial_state=first,
                    output_final_state=row_state is not None, **arrays, **static, **split)
      return o[0], None if row_state is None else jax.tree.map(lambda s: s[0], final)
    return jax.vmap(row)(args, cu_seqlens, state)

  if neutral and state is not None and packing is not None and packing.prompt_length is not None:
    args, packing = neutral_padding(args, neutral, packing.prompt_length), None
  cu_seqlens = None if packing is None else packing.cu_seqlens
  return sharding.shard_op(call, args, state, arrays, cu_seqlens)


def neutral_padding(args: tuple, neutral: dict[int, float], length) -> tuple:
  """`args` ([B, L, ...]) with the `neutral` ones set to their value from token `length` on."""
  pad = jnp.arange(args[0].shape[1]) >= length
  return tuple(a if i not in neutral else
               jnp.where(pad.reshape(1, -1, *(1,) * (a.ndim - 2)), jnp.asarray(neutral[i], a.dtype), a)
               for i, a in enumerate(args))
