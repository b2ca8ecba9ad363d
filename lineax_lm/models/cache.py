"""Cache sizes of a model configuration: the bytes a sequence's decode cache takes (recurrent states
of the linear layers, KV caches of the attention layers), from the layer dimensions or from the
cache the model builds, and a table comparing configurations."""
from __future__ import annotations

import jax
from flax import nnx

from lineax_lm.models.hybrid import abstract_model, abstract_model_one_block_per_kind


def cache_bytes(config, context_len: int) -> dict:
  """Bytes one sequence's cache needs at `context_len` tokens: {"attention", "linear", "total"},
  from the layer dimensions (the model is built abstractly, no parameters are allocated, with one
  block per kind: a layer's cache depends on its layer only through that kind)."""
  return abstract_model_one_block_per_kind(config).cache_bytes(context_len)


def real_cache_bytes(model_or_config, context_len: int, batch: int = 1) -> int:
  """nbytes of the cache the model builds for `batch` sequences of `context_len` tokens (shapes
  only: jax.eval_shape, so large contexts cost nothing)."""
  model = model_or_config
  if not isinstance(model, nnx.Module):
    model = abstract_model(model)
  tree = jax.eval_shape(lambda: model.init_cache(batch, context_len))
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree["layers"]))


def cache_report(configs: dict, context_len: int) -> str:
  """A table of cache sizes at `context_len` for {name: ModelConfig}, relative to the first."""
  rows, base = [], None
  for name, cfg in configs.items():
    b = cache_bytes(cfg, context_len)
    base = base or b["total"]
    rows.append(f"{name:32s} {b['total'] / 2**20:10.1f} MiB  attention {b['attention'] / 2**20:9.1f}  "
                f"linear {b['linear'] / 2**20:7.1f}  x{b['total'] / base:.3f}")
  return f"cache per sequence at {context_len} tokens\n" + "\n".join(rows)
