"""Input validation shared by every op: a bad argument raises a ValueError that names it.

Values are only checked when they are concrete (eager calls); under `jax.jit` the shapes are still
checked, and gates that must be log-decays are clamped to <= 0 (documented in each op's docstring),
because a traced value cannot raise.
"""
from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
  return x is not None and not isinstance(x, jax.core.Tracer)


def check_rank(name: str, x, rank: int, layout: str):
  if x is None or getattr(x, "ndim", None) != rank:
    shape = None if x is None else getattr(x, "shape", type(x).__name__)
    raise ValueError(f"`{name}` must have rank {rank} ({layout}); got shape {shape}")


def check_shape(name: str, x, expected: tuple, layout: str):
  if tuple(x.shape) != tuple(expected):
    raise ValueError(f"`{name}` must have shape {layout} = {tuple(expected)}; got {tuple(x.shape)}")


def check_qkv(q, k, v, q_name: str = "q") -> tuple[int, int, int, int, int]:
  """q, k: [B, T, H, K]; v: [B, T, H, V]. Returns (B, T, H, K, V)."""
  check_rank(q_name, q, 4, "[B, T, H, K]")
  check_rank("k", k, 4, "[B, T, H, K]")
  check_rank("v", v, 4, "[B, T, H, V]")
  B, T, H, K = q.shape
  check_shape("k", k, (B, T, H, K), "[B, T, H, K]")
  if K < 1 or v.shape[-1] < 1:
    raise ValueError(f"`{q_name}`, `k` and `v` must have head dims K, V >= 1; got K = {K}, "
                     f"V = {v.shape[-1]}")
  if tuple(v.shape[:3]) != (B, T, H):
    raise ValueError(f"`v` must have shape [B, T, H, V] with (B, T, H) = {(B, T, H)} from `{q_name}`; "
                     f"got {tuple(v.shape)}")
  for name, x in ((q_name, q), ("k", k), ("v", v)):
    check_floating(name, x)
  return B, T, H, K, v.shape[-1]


def num_sequences(B: int, T: int, cu_seqlens) -> int:
  """Validates cu_seqlens (packed varlen, FlashAttention style) and returns the number of sequences."""
  if cu_seqlens is None:
    return B
  if B != 1:
    raise ValueError(f"`cu_seqlens` requires packed inputs with batch size B == 1; got B = {B}. "
                     "Concatenate the sequences along the time axis first.")
  if getattr(cu_seqlens, "ndim", None) != 1 or cu_seqlens.shape[0] < 2:
    raise ValueError("`cu_seqlens` must be a 1-D array of N+1 offsets [0, ..., T]; "
                     f"got shape {getattr(cu_seqlens, 'shape', None)}")
  if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
    raise ValueError(f"`cu_seqlens` must hold integers (int32 offsets); got dtype {cu_seqlens.dtype}")
  if is_concrete(cu_seqlens):
    cu = np.asarray(cu_seqlens)
    if cu[0] != 0:
      raise ValueError(f"`cu_seqlens` must start at 0; got {cu[0]}")
    if np.any(np.diff(cu) < 0):
      raise ValueError(f"`cu_seqlens` must be non-decreasing; got {cu.tolist()}")
    if cu[-1] != T:
      raise ValueError(f"`cu_seqlens` must end at the packed length T = {T}; got {cu[-1]}")
  return cu_seqlens.shape[0] - 1


def check_state(name: str, state, expected: tuple, layout: str):
  if state is not None:
    check_rank(name, state, len(expected), layout)
    check_shape(name, state, expected, layout)
    check_floating(name, state)  # a complex state would lose its imaginary part in float32


def check_scale(scale):
  """`scale` must be a real number, or a 0-d floating array (None: the op's default); a concrete
  one must be finite."""
  if scale is None:
    return
  real = (isinstance(scale, numbers.Real) and not isinstance(scale, bool)) or (
      getattr(scale, "ndim", None) == 0 and jnp.issubdtype(scale.dtype, jnp.floating))
  if not real:
    raise ValueError(f"`scale` must be a real number (the query scale; None: K ** -0.5); got "
                     f"{type(scale).__name__} {scale!r}")
  if is_concrete(scale) and not np.isfinite(float(scale)):
    raise ValueError(f"`scale` must be finite; got {float(scale)}")


@jax.custom_jvp
def _clamp_to_nonpositive(g):
  return jnp.minimum(g, 0.0)


# The clamp's gradient passes straight through: min(g, 0)'s own would be a mask kept for the
# backward and applied there in a pass of its own over per-channel gates [B, T, H, K] (0.13 ms of
# KDA's 5.5 ms fwd+bwd at the anchor shape), for gates that are out of range anyway.
_clamp_to_nonpositive.defjvp(lambda primals, tangents: (_clamp_to_nonpositive(*primals), *tangents))


def log_decay(name: str, g):
  """Gates that are natural-log decays must be <= 0: error when concrete, clamp when traced (its
  gradient passed through unchanged)."""
  if g is None:
    return None
  if is_concrete(g):
    gmax = float(jnp.max(g)) if g.size else 0.0
    if not gmax <= 0.0:  # also catches NaN
      raise ValueError(f"`{name}` holds natural-log decays, which must be <= 0 (decay = exp({name}) <= 1); "
                       f"its maximum is {gmax}. Pass log-space gates, e.g. jax.nn.log_sigmoid(logits).")
    return g
  return _clamp_to_nonpositive(g)


def check_floating(name: str, x):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"`{name}` must be a floating-point array; got dtype {x.dtype}")
