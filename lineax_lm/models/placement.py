"""Where a hybrid's attention layers go: the indices an `attn_ratio` ("pure", "transformer",
"r:1") or explicit `attn_layers` name, and the ratio a placement has.

`attention_layers` is the periodic placement ("r:1" = r linear layers then one attention layer,
repeated); `spread_attention_layers` keeps the asked share of attention at any depth. A config
section picks between them with `attn_placement` (`PLACEMENTS`).
"""
from __future__ import annotations

import math
import warnings

# How a ratio places its attention layers when a config section names `attn_placement`:
# "periodic" (`attention_layers`, the default) or "spread" (`spread_attention_layers`).
PLACEMENTS = ("periodic", "spread")


def attention_layers(num_layers: int, attn_ratio: str = "pure", explicit=None) -> tuple:
  """Indices of the attention layers. "r:1": r linear layers then one attention layer, repeated
  (when num_layers < r + 1 the one attention layer is the last layer)."""
  if explicit is not None:
    bad = [i for i in explicit if not 0 <= i < num_layers]
    if bad:
      raise ValueError(f"`attn_layers` {bad} are outside 0..{num_layers - 1}")
    return tuple(sorted(set(explicit)))
  r = _ratio_linear_layers(attn_ratio)
  if r == 0:
    return ()
  if r is None:
    return tuple(range(num_layers))
  period = r + 1
  layers = tuple(i for i in range(num_layers) if i % period == period - 1) or (num_layers - 1,)
  wanted = ratio_layer_count(num_layers, r)
  if len(layers) != wanted:
    warnings.warn(
        f"attn_ratio {attn_ratio!r} at {num_layers} layers places {len(layers)} attention layer(s) "
        f"{list(layers)} (effective {effective_ratio(num_layers, layers)}), where the ratio asks for "
        f"{wanted}; ratios whose counts coincide at this depth give the same model. "
        f"spread_attention_layers({num_layers}, {attn_ratio!r}) = "
        f"{list(spread_attention_layers(num_layers, attn_ratio))} (pass it as attn_layers)",
        stacklevel=2)
  return layers


def _ratio_linear_layers(attn_ratio: str) -> int | None:
  """r of an "r:1" ratio (linear layers per attention layer); 0 for "pure" (no attention), None
  for "transformer" (attention only). Raises for anything else."""
  ratio = str(attn_ratio).strip().lower()
  if ratio in ("pure", "none", "linear"):
    return 0
  if ratio in ("transformer", "attention", "all"):
    return None
  r, _, one = ratio.partition(":")
  if one != "1" or not r.isdigit() or int(r) < 1:
    raise ValueError(f"`attn_ratio` must be 'pure', 'transformer', 'attention' or 'r:1' with r >= 1 "
                     f"(e.g. '3:1'); got {attn_ratio!r}")
  return int(r)


def ratio_layer_count(num_layers: int, r: int) -> int:
  """The number of attention layers an "r:1" ratio asks for at `num_layers`: num_layers / (r + 1)
  rounded to the nearest integer (halves up), at least 1."""
  return min(num_layers, max(1, math.floor(num_layers / (r + 1) + 0.5)))


def spread_attention_layers(num_layers: int, attn_ratio: str) -> tuple:
  """Attention layers for `attn_ratio` that keep the asked share of attention at any depth:
  n = `ratio_layer_count` layers, each the last layer of one of n equal stretches of the stack
  (round((j + 1) num_layers / n) - 1). Where the periodic placement of `attention_layers` is exact
  (3:1 at 24 layers: 3, 7, ..., 23) the two agree; at 24 layers "24:1", "12:1", "6:1", "3:1" give
  1, 2, 3, 6 layers (effective 23:1, 11:1, 7:1, 3:1), where the periodic placement gives 1, 1, 3, 6.
  "pure" and "transformer" are as in `attention_layers`."""
  r = _ratio_linear_layers(attn_ratio)
  if not r:  # "pure" (0) or "transformer" (None)
    return attention_layers(num_layers, attn_ratio)
  n = ratio_layer_count(num_layers, r)
  return tuple(sorted({math.floor((j + 1) * num_layers / n + 0.5) - 1 for j in range(n)}))


def effective_ratio(num_layers: int, attn_layers) -> str:
  """The linear:attention ratio a placement has: "pure", "transformer", or "<linear / attention>:1"
  (e.g. "7:1" for 3 attention layers of 24; fractions with up to two decimals)."""
  n = len(set(attn_layers))
  if n == 0:
    return "pure"
  if n == num_layers:
    return "transformer"
  return f"{round((num_layers - n) / n, 2):g}:1"
