"""Softmax attention exactly as HF Llama's: q/k/v/o projections without bias, GQA, RoPE (rotate-half
layout, theta from the config), optional sliding window, and a KV cache for decode.

`attn_impl` picks the kernel of the full-sequence passes (training, prefill): "xla" and "cudnn" are
`jax.nn.dot_product_attention`'s; "splash" is jax's Pallas TPU flash-attention kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`, what MaxText trains with), which never holds
the [L, L] scores; None takes "splash" on a TPU (the layer's `backend` is "tpu", or "auto" on a
TPU host) and `jax.nn.dot_product_attention`'s default elsewhere, which is its XLA path (it forms
the [B, H, L, L] float32 scores; on a GPU, "cudnn" is the flash kernel). Decode steps, and lengths
that are not a multiple of 128, take `jax.nn.dot_product_attention`. A prompt prefilled into a
cache on the XLA path runs in chunks of query rows when its scores would exceed
PREFILL_SCORE_BYTES (`prefill_attention`), so that they are held one chunk at a time. "splash" off
a TPU runs the kernel in Pallas interpret mode (the tests' way to check it on a CPU), except under
`backend="tpu"`, which compiles for a TPU (the ahead-of-time compile, `lineax_lm.train.aot`). Under
a mesh that splits the sequence over `context` (training), keys and values are gathered from every
slice (`context_parallel_attention`).

`use_short_conv` (off by default, so the layer is Llama's) puts a causal depthwise convolution over
the last `conv_size` tokens on q, k and v, as the linear mixers have (and as Zoology's MQAR models
put one before attention): a key then carries the tokens just before it, which plain attention
must first learn a previous-token head for. The convolutions start as the identity (the current
token's tap 1, the others small), so the layer starts as plain attention.

Cache of one layer: {"k": [B, S, Hkv, Dh], "v": [B, S, Hkv, Dh]} in the activation dtype, S = the
maximum length, and with `use_short_conv` "conv": {"q", "k", "v": [B, conv_size - 1, C]} (the
convolutions' last inputs); the model says where the new tokens go (`Context.cache_index`; None:
at the start of a fresh cache, a prompt that attends causally within itself).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.sharding import PartitionSpec as P
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from lineax_lm import sharding
from pallas_kernels.common import dispatch
from lineax_lm.layers.base import ShortConvs, ctx_or_default
from lineax_lm.layers.common import (Context, LayerSpec, MixerConfig, dense, merge_heads,
                                     residual_dense, rope, split_heads)


@dataclasses.dataclass(frozen=True)
class AttentionConfig(MixerConfig):
  num_heads: int = 16
  num_kv_heads: int | None = None   # None: num_heads (no GQA)
  head_dim: int | None = None       # None: hidden // num_heads
  rope_theta: float = 10000.0
  window: int | None = None         # sliding window: a query sees itself and window - 1 earlier keys
  qkv_bias: bool = False
  attn_impl: str | None = None      # None, "xla", "cudnn" or "splash" (module docstring)
  use_short_conv: bool = False


def attention_mask(q_pos, k_pos, window=None, q_ids=None, k_ids=None):
  """Boolean [B, 1, Lq, Lk]: causal, within the window, and (packed rows) within one sequence.
  q_pos: [B, Lq] / [Lq]; k_pos: [B, Lk] / [Lk] positions in the row (or cache slots)."""
  q_pos, k_pos = jnp.atleast_2d(q_pos), jnp.atleast_2d(k_pos)
  mask = k_pos[:, None, :] <= q_pos[:, :, None]
  if window is not None:
    mask &= k_pos[:, None, :] > q_pos[:, :, None] - window
  if q_ids is not None:
    mask &= k_ids[:, None, :] == q_ids[:, :, None]
  return mask[:, None]


IMPLEMENTATIONS = (None, "xla", "cudnn", "splash")


def resolve_impl(attn_impl: str | None, backend: str, length: int) -> str | None:
  """The kernel a full-sequence pass of `length` tokens takes (module docstring): "splash" or
  `jax.nn.dot_product_attention`'s `implementation`."""
  if attn_impl not in IMPLEMENTATIONS:
    raise ValueError(f"`attn_impl` must be one of {IMPLEMENTATIONS}; got {attn_impl!r}")
  on_tpu = backend == "tpu" or (backend == "auto" and dispatch.platform() == "tpu")
  if attn_impl is None and on_tpu:
    attn_impl = "splash"
  if attn_impl == "splash" and length % 128:  # the kernel's key blocks are whole 128-lane tiles
    return None
  return attn_impl


def dot_product_attention(q, k, v, ids=None, window=None, implementation=None):
  """Causal attention of q [B, L, H, Dh] over k, v [B, L, Hkv, Dh] on one device (RoPE applied),
  within `window` and, for packed rows, within the sequence of each token's id (`ids` [B, L])."""
  if ids is None and window is None:
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
  t = jnp.arange(q.shape[1])
  return jax.nn.dot_product_attention(q, k, v, mask=attention_mask(t, t, window, ids, ids),
                                      implementation=implementation)


# The float32 scores of one chunk of query rows in `prefill_attention`'s XLA path: at 512 MiB a
# prompt of 2,048 tokens at batch 64 x 16 heads (16 GiB of scores) runs in 32 chunks.
PREFILL_SCORE_BYTES = 1 << 29


def query_chunk(batch: int, heads: int, q_length: int, k_length: int, score_bytes: int) -> int:
  """Rows of a query chunk whose [batch, heads, rows, k_length] float32 scores fit `score_bytes`
  (at least 1), balanced over the fewest chunks that cover `q_length` rows; q_length when all do."""
  rows = max(1, score_bytes // (batch * heads * k_length * 4))
  if rows >= q_length:
    return q_length
  chunks = -(-q_length // rows)
  return -(-q_length // chunks)


def prefill_attention(q, k, v, window=None, implementation=None):
  """Causal attention (within `window`) of a prompt q [B, L, H, Dh] over its own keys and values
  k, v [B, L, Hkv, Dh], RoPE applied: the prefill of a fresh cache (inference: a gradient through
  the chunks would keep every chunk's probabilities).

  cuDNN's flash kernel never holds the scores. The XLA path of `jax.nn.dot_product_attention`
  forms them whole, [B, H, L, L] float32 (16 GiB for 2,048 tokens at batch 64 x 16 heads), and its
  softmax two more buffers of that size, so here it runs over chunks of query rows (`lax.map`: one
  chunk's scores live at a time, at most PREFILL_SCORE_BYTES), each chunk's causal mask compared
  from positions inside the fused softmax rather than stored. Every row's softmax still spans all L
  keys (those after it masked, as `is_causal` masks them), so each row is computed as in one call
  over the whole prompt. A last chunk past L is padded with zero queries."""
  B, L, H, Dh = q.shape
  S = k.shape[1]
  rows = query_chunk(B, H, L, S, PREFILL_SCORE_BYTES)
  if implementation == "cudnn" or rows == L:
    return dot_product_attention(q, k, v, window=window, implementation=implementation)
  chunks = -(-L // rows)
  q = jnp.pad(q, ((0, 0), (0, chunks * rows - L), (0, 0), (0, 0)))
  q_chunks = jnp.moveaxis(q.reshape(B, chunks, rows, H, Dh), 1, 0)
  k_pos = jnp.arange(S)

  def one_chunk(args):
    first_row, q_chunk = args
    mask = attention_mask(first_row + jnp.arange(rows), k_pos, window)  # [1, 1, rows, S]
    return jax.nn.dot_product_attention(q_chunk, k, v, mask=mask, implementation=implementation)
  o = lax.map(one_chunk, (jnp.arange(chunks) * rows, q_chunks))
  return jnp.moveaxis(o, 0, 1).reshape(B, chunks * rows, H, Dh)[:, :L]


@functools.lru_cache(maxsize=64)
def splash_kernel(heads: int, q_length: int, k_length: int, window: int | None, q_shards: int = 1,
                  interpret: bool = False):
  """jax's splash-attention kernel for `heads` heads of causal attention (within `window`), queries
  [q_length] over keys [k_length]; with `q_shards` > 1 the query rows are split over that many
  devices, each calling the kernel on its slice of q against all the keys (its mask tables shard
  with `manual_sharding_spec`). Blocks of 512 tokens where they divide the lengths."""
  shape = (k_length, k_length)
  mask = (splash_mask.CausalMask(shape) if window is None
          else splash_mask.LocalMask(shape, window_size=(window - 1, 0), offset=0))
  block_q = next(b for b in (512, 256, 128) if (q_length // q_shards) % b == 0)
  block_k = next(b for b in (512, 256, 128) if k_length % b == 0)
  blocks = splash.BlockSizes(block_q=block_q, block_kv=block_k, block_kv_compute=block_k,
                             block_q_dkv=block_q, block_kv_dkv=block_k, block_kv_dkv_compute=block_k,
                             block_q_dq=block_q, block_kv_dq=block_k)
  return splash.make_splash_mha(splash_mask.MultiHeadMask([mask] * heads), block_sizes=blocks,
                                head_shards=1, q_seq_shards=q_shards, interpret=interpret)


def splash_attention(q, k, v, ids=None, window=None, kernel=None, k_ids=None, interpret=False):
  """`dot_product_attention` through jax's Pallas TPU splash-attention kernel (flash attention over
  blocks, skipping the blocks the causal and window masks empty; GQA as is): q [B, Lq, H, Dh] over
  k, v [B, Lk, Hkv, Dh]. `kernel`: a `splash_kernel` (default: the one for these shapes, Lq = Lk);
  `k_ids` the keys' sequence ids where they are not `ids` (context parallelism). The kernel does not
  scale: q is scaled by 1/sqrt(Dh) first, as `jax.nn.dot_product_attention` does."""
  B, Lq, H, Dh = q.shape
  kernel = kernel or splash_kernel(H, Lq, k.shape[1], window, interpret=interpret)
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)
  q = heads_first(q * jnp.asarray(Dh ** -0.5, q.dtype))

  def one_row(q, k, v, q_ids, k_ids):
    segments = None if q_ids is None else splash.SegmentIds(q=q_ids, kv=k_ids)
    return kernel(q, k, v, segment_ids=segments)
  k_ids = ids if k_ids is None else k_ids
  o = jax.vmap(one_row)(q, heads_first(k), heads_first(v), ids, k_ids)
  return heads_first(o)


def context_parallel_attention(q, k, v, ids=None, window=None, implementation=None, interpret=False):
  """Causal attention of q [B, L, H, Dh] over k, v [B, L, Hkv, Dh] with L split over the mesh's
  `context` axis: each device all-gathers every slice's keys and values (and segment ids `ids`
  [B, L] of packed rows) and attends its own queries to the whole sequence, the causal and window
  mask offset by its slice's start. RoPE is already applied (on global positions), so only the mask
  needs the offset. Returns o [B, L, H, Dh], split like q. With "splash" the kernel's mask tables
  are built for the whole [L, L] mask and split by query rows with the slices, so each device's
  kernel skips exactly the blocks its rows do not see.

  All-gather rather than a ring: at 2-8 devices the gathered K/V are a few times one slice's
  activations (GQA keeps them small), the gather is one collective XLA overlaps with the projections,
  and attention stays one fused call with a mask. A ring passes K/V in c - 1 sequential steps, each
  a partial softmax merged online, and pays off when the whole sequence's K/V would not fit or at
  many more devices."""
  if implementation == "splash":
    mesh = jax.sharding.get_abstract_mesh()
    c, tensor = mesh.shape[sharding.CONTEXT_AXIS], mesh.shape[sharding.HEAD_AXIS]
    heads = q.shape[2] // tensor if q.shape[2] % tensor == 0 and k.shape[2] % tensor == 0 else q.shape[2]
    kernel = splash_kernel(heads, q.shape[1], q.shape[1], window, q_shards=c, interpret=interpret)
    kernel_spec = lambda mesh, head: kernel.manual_sharding_spec(
        jax.sharding.NamedSharding(mesh, P(None, sharding.CONTEXT_AXIS)))

    def local(q, k, v, ids, kernel):
      k_ids = None if ids is None else sharding.gather_sequence(ids)
      return splash_attention(q, sharding.gather_sequence(k), sharding.gather_sequence(v), ids,
                              window, kernel=kernel, k_ids=k_ids)
    return sharding.context_map(local, (q, k, v, ids, kernel), ("time",) * 4 + (kernel_spec,),
                                k.shape[2])

  def local(q, k, v, ids):
    length = q.shape[1]
    keys = sharding.gather_sequence(k)
    q_index = sharding.slice_start(length) + jnp.arange(length)
    k_ids = None if ids is None else sharding.gather_sequence(ids)
    mask = attention_mask(q_index, jnp.arange(keys.shape[1]), window, ids, k_ids)
    return jax.nn.dot_product_attention(q, keys, sharding.gather_sequence(v), mask=mask,
                                        implementation=implementation)
  return sharding.context_map(local, (q, k, v, ids), ("time",) * 4, k.shape[2])


class Attention(ShortConvs, nnx.Module):
  """Llama attention. x: [B, L, D] -> ([B, L, D], new KV cache or None)."""

  def __init__(self, cfg: AttentionConfig, spec: LayerSpec, rngs: nnx.Rngs):
    D, H = spec.hidden, cfg.num_heads
    Hkv = cfg.num_kv_heads or H
    if H % Hkv:
      raise ValueError(f"`num_heads` {H} must be a multiple of `num_kv_heads` {Hkv}")
    self.head_dim = cfg.head_dim or D // H
    if self.head_dim % 2:
      raise ValueError(f"RoPE needs an even head dim; got {self.head_dim}")
    if cfg.window is not None and cfg.window < 1:
      raise ValueError(f"`window` must be >= 1 or None; got {cfg.window}")
    self.cfg, self.spec, self.num_kv_heads = cfg, spec, Hkv
    kv = Hkv * self.head_dim
    self.q_proj = dense(D, H * self.head_dim, ("embed", "heads"), spec, rngs, bias=cfg.qkv_bias)
    self.k_proj = dense(D, kv, ("embed", "kv_heads"), spec, rngs, bias=cfg.qkv_bias)
    self.v_proj = dense(D, kv, ("embed", "kv_heads"), spec, rngs, bias=cfg.qkv_bias)
    self.o_proj = residual_dense(H * self.head_dim, D, ("heads", "embed"), spec, rngs)
    if cfg.use_short_conv:
      for name, channels in (("q", H * self.head_dim), ("k", kv), ("v", kv)):
        conv = self._make_conv(name, channels, rngs, activation=None)
        conv.weight[...] = conv.weight[...].at[-1].add(1.0)  # the current token's tap: identity start

  def __call__(self, x, cache=None, ctx: Context | None = None):
    cfg = self.cfg
    ctx = ctx_or_default(x, ctx)
    (q, k, v), conv = self.short_conv({"q": self.q_proj(x), "k": self.k_proj(x), "v": self.v_proj(x)},
                                      cache, ctx, fallback=None)
    q = rope(split_heads(q, self.head_dim), ctx.positions, cfg.rope_theta)
    k = rope(split_heads(k, self.head_dim), ctx.positions, cfg.rope_theta)
    v = split_heads(v, self.head_dim)
    L = x.shape[1]
    if cache is not None:
      if ctx.packing is not None and ctx.cache_index is not None:
        raise ValueError("packed inputs (`segment_ids`) cannot be combined with a decode cache")
      start = jnp.zeros((), jnp.int32) if ctx.cache_index is None else ctx.cache_index
      idx = (0, start, 0, 0)
      cache = {"k": lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), idx),
               "v": lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), idx),
               **({"conv": conv} if self.conv_names else {})}
      if ctx.cache_index is not None:  # after earlier tokens: attend over the cache's slots
        k, v = cache["k"].astype(q.dtype), cache["v"].astype(q.dtype)
        mask = attention_mask(start + jnp.arange(L), jnp.arange(k.shape[1]), cfg.window)
        decode_impl = None if cfg.attn_impl == "splash" else cfg.attn_impl
        o = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=decode_impl)
        return self.o_proj(merge_heads(o)), cache
    # the whole sequence: training, or a prompt into a fresh cache (`cache_index` None), whose
    # tokens see only each other: causal attention over them, never a mask over the cache's slots
    # (`prefill_attention`). A prompt padded to a compiled width (packed, with a cache) needs no
    # mask between its sequences: the padding follows the prompt, and decoding overwrites its
    # slots (from the prompt's length on) before its causal mask reaches them.
    ids = None if ctx.packing is None or cache is not None else ctx.packing.reset_ids
    impl = resolve_impl(cfg.attn_impl, cfg.backend, L)
    # off a TPU (and not compiling for one: backend "tpu"), the kernel runs in interpret mode
    interpret = cfg.backend != "tpu" and dispatch.platform() != "tpu"
    if cache is None and sharding.context_axis(L):
      o = context_parallel_attention(q, k, v, ids, cfg.window, impl, interpret)
    elif impl == "splash":  # a Pallas kernel: each device runs it on its own rows and heads
      o = sharding.rows_heads_map(
          functools.partial(splash_attention, window=cfg.window, interpret=interpret),
          (q, k, v, ids), ("time",) * 4, k.shape[2])
    elif cache is not None:
      o = prefill_attention(q, k, v, cfg.window, impl)
    else:
      o = dot_product_attention(q, k, v, ids, cfg.window, impl)
    return self.o_proj(merge_heads(o)), cache

  def init_cache(self, batch: int, max_len: int, dtype=None):
    shape = (batch, max_len, self.num_kv_heads, self.head_dim)
    dtype = dtype or self.spec.dtype
    cache = {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
    if self.conv_names:
      cache["conv"] = self.conv_cache(batch, dtype)
    return cache

  def cache_bytes(self, context_len: int, dtype=None) -> int:
    """2 * kv_heads * head_dim * bytes per token, for `context_len` tokens of one sequence (plus the
    convolutions' (conv_size - 1) * channels inputs with `use_short_conv`)."""
    itemsize = jnp.dtype(dtype or self.spec.dtype).itemsize
    return (2 * self.num_kv_heads * self.head_dim * context_len * itemsize
            + self.conv_cache_bytes(itemsize))
