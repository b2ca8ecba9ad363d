"""Linear attention (Katharopoulos et al. 2020) as fla's `LinearAttention` layer.

q/k/v projections, a feature map on q and k (fla's default "elementwise_product": a Hadamard map
layer1(x) * layer2(x) with two head_dim x head_dim linears, separate for q and k), S = S + k v^T,
o = S^T (scale q), per-head output RMSNorm, output projection. No short convolution.
"""
from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from pallas_kernels.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn

from lineax_lm.layers.base import LinearMixer
from lineax_lm.layers.common import Context, LayerSpec, MixerConfig, dense, run_op

FEATURE_MAPS = ("elementwise_product", "elu", "relu", "identity")


def _elu_p1(x):
  return jax.nn.elu(x) + 1


def _identity(x):
  return x


_STATELESS_MAPS = {"elu": _elu_p1, "relu": jax.nn.relu, "identity": _identity}


def _matrix_state(op):
  """`op` returning the matrix state S alone: with normalize=True the op's state is (S, z), and this
  layer's cache keeps S only, so its normalizer sums the keys of each call."""
  def call(*args, normalize, **kwargs):
    o, state = op(*args, normalize=normalize, **kwargs)
    return o, state[0] if normalize else state
  return call


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig(MixerConfig):
  num_heads: int = 8
  expand_k: float = 1.0
  expand_v: float = 1.0
  feature_map: str = "elementwise_product"
  normalize: bool = False     # the op's `normalize` (divide by the running sum of q.k)
  use_short_conv: bool = False


class HadamardFeatureMap(nnx.Module):
  """layer1(x) * layer2(x) on each head's [..., head_dim] (fla's HadamardFeatureMap)."""

  def __init__(self, head_dim: int, spec: LayerSpec, rngs):
    self.layer1 = dense(head_dim, head_dim, (None, None), spec, rngs, bias=True)
    self.layer2 = dense(head_dim, head_dim, (None, None), spec, rngs, bias=True)

  def __call__(self, x):
    return self.layer1(x) * self.layer2(x)


class LinearAttention(LinearMixer):
  """x: [B, L, D] -> ([B, L, D], new cache or None)."""

  def __init__(self, cfg: LinearAttentionConfig, spec: LayerSpec, rngs: nnx.Rngs):
    self._setup(cfg, spec)
    if cfg.feature_map not in FEATURE_MAPS:
      raise ValueError(f"`feature_map` must be one of {FEATURE_MAPS}; got {cfg.feature_map!r}")
    D, H = spec.hidden, cfg.num_heads
    self._make_qkv(H, int(D * cfg.expand_k), int(D * cfg.expand_v), rngs)
    if cfg.feature_map == "elementwise_product":
      self.feature_map_q = HadamardFeatureMap(self.head_k_dim, spec, rngs)
      self.feature_map_k = HadamardFeatureMap(self.head_k_dim, spec, rngs)
    else:
      self.feature_map_q = self.feature_map_k = nnx.static(_STATELESS_MAPS[cfg.feature_map])
    self._make_output(self.value_dim, self.head_v_dim, rngs, gate=False)

  def __call__(self, x, cache=None, ctx: Context | None = None):
    q, k, v, conv = self.qkv(x, cache, ctx)
    q, k = self.feature_map_q(q), self.feature_map_k(k)
    o, state = run_op(_matrix_state(chunk_linear_attn), _matrix_state(fused_recurrent_linear_attn),
                      (q, k, v), state=self.state_of(cache), decode=self.decoding(x, cache),
                      packing=ctx and ctx.packing, normalize=self.cfg.normalize,
                      backend=self.cfg.backend, neutral={1: 0.0})
    return self.output(o, x), self.new_cache(cache, state, conv)
