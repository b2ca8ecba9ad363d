"""Device mesh and logical-axis sharding rules (a data table, as in MaxText).

Mesh axes: ("data", "fsdp", "tensor"). Parameters carry logical axis names (nnx.with_partitioning
metadata set by the layers); RULES maps each logical name to mesh axes. A dimension that the mesh
axis does not divide, or a mesh axis already used by another dimension, stays replicated.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axes, in order of preference.
RULES = {
    "batch": BATCH_AXES,
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "q_heads": ("tensor",),
    "layers": (),
}


def make_mesh(cfg) -> jax.sharding.Mesh:
  """cfg: the `mesh` section with sizes for data, fsdp, tensor; one of them may be -1 (the rest)."""
  sizes = [int(cfg[a]) for a in MESH_AXES]
  n = jax.device_count()
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh: at most one of {MESH_AXES} may be -1; got {dict(zip(MESH_AXES, sizes))}")
  if -1 in sizes:
    known = math.prod(s for s in sizes if s != -1)
    if n % known:
      raise ValueError(f"mesh: {dict(zip(MESH_AXES, sizes))} does not divide the {n} devices")
    sizes[sizes.index(-1)] = n // known
  if math.prod(sizes) != n:
    raise ValueError(f"mesh: {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices; "
                     f"there are {n}")
  # Auto axes: XLA propagates shardings from the parameters and the batch (no explicit-sharding types).
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def logical_to_spec(names, shape, mesh) -> P:
  """PartitionSpec for an array with logical axis `names` (None entries replicate)."""
  used, spec = set(), []
  for name, dim in zip(names or (), shape):
    axes = tuple(a for a in RULES.get(name, ()) if a not in used and mesh.shape[a] > 1)
    size = math.prod(mesh.shape[a] for a in axes)
    if axes and dim % size == 0:
      used.update(axes)
      spec.append(axes if len(axes) > 1 else axes[0])
    else:
      spec.append(None)
  return P(*spec)


def _names(variable):
  meta = variable.get_metadata() if hasattr(variable, "get_metadata") else {}
  for key in ("out_sharding", "sharding_names", "sharding"):  # the key moved across flax versions
    if meta.get(key):
      return meta[key]
  return None


def state_shardings(state: nnx.State, mesh) -> nnx.State:
  """NamedShardings for an nnx.State from its variables' logical axis names."""
  def one(variable):
    value = variable.get_value() if hasattr(variable, "get_value") else variable.value
    return variable.replace(NamedSharding(mesh, logical_to_spec(_names(variable), np.shape(value), mesh)))
  return jax.tree_util.tree_map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
