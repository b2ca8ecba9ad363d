"""The device mesh: its axes, the logical-axis sharding rules (a data table, as in MaxText), and
how an op call is sharded over it.

Mesh axes: ("data", "fsdp", "tensor"). Parameters carry logical axis names (nnx.with_partitioning
metadata set by the layers); RULES maps each logical name to mesh axes. A dimension that the mesh
axis does not divide, or a mesh axis already used by another dimension, stays replicated. Layers,
the model and the training loop all read the mesh through this module.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
HEAD_AXIS = "tensor"

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
  for axis, size in zip(MESH_AXES, sizes):
    if size < 1 and size != -1:
      raise ValueError(f"config.mesh.{axis}={size}: must be an integer >= 1, or -1 (all remaining "
                       "devices)")
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


def shard_op(call, args: tuple, state, arrays: dict, cu_seqlens):
  """`call(args, state, arrays, cu_seqlens) -> (o, final state or None)` under the current mesh.

  Pallas kernels do not partition: inside `jit` they see the global array. So under a mesh with
  the training axes the call runs inside `jax.shard_map` over the batch (data, fsdp) and head
  (tensor) axes, each device on its own rows and heads; axes that do not divide an array's size
  stay replicated. `args` are time-major [B, L, H, ...] (HGRN: [B, L, D], D split like heads),
  `state` leaves [B, H, ...], `arrays` per-head [H, ...], `cu_seqlens` per row [B, ...]. Without such a
  mesh (or on one device) it is a plain call.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or not set(BATCH_AXES + (HEAD_AXIS,)) <= set(mesh.axis_names):
    return call(args, state, arrays, cu_seqlens)
  B = args[0].shape[0]
  batch = tuple(a for a in BATCH_AXES if mesh.shape[a] > 1)
  shards = math.prod(mesh.shape[a] for a in batch)
  batch = batch if batch and B % shards == 0 else None
  heads_dim = args[0].shape[2] if args[0].ndim >= 3 else args[0].shape[-1]
  head = HEAD_AXIS if mesh.shape[HEAD_AXIS] > 1 and heads_dim % mesh.shape[HEAD_AXIS] == 0 else None
  timed, per_seq = P(batch, None, head), P(batch, head)
  specs_in = (tuple(timed for _ in args), None if state is None else per_seq,
              {n: P(head) for n in arrays}, None if cu_seqlens is None else P(batch))
  sharded = jax.shard_map(call, mesh=mesh, in_specs=specs_in,
                          out_specs=(timed, None if state is None else per_seq), check_vma=False)
  return sharded(args, state, arrays, cu_seqlens)
