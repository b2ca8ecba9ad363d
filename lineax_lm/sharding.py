"""The device mesh: its axes, the logical-axis sharding rules (a data table, as in MaxText), and
how an op call is sharded over it.

Mesh axes: ("data", "fsdp", "context", "tensor"). Parameters carry logical axis names
(nnx.with_partitioning metadata set by the layers); RULES maps each logical name to mesh axes. A
dimension that the mesh axis does not divide, or a mesh axis already used by another dimension, stays
replicated. Layers, the model and the training loop all read the mesh through this module.

Context parallelism: the batch's rows are split over (data, fsdp) and its time axis T into `context`
contiguous equal slices, device i of the axis holding tokens [i T / c, (i + 1) T / c). Token-wise
work (projections, norms, MLPs, the packing bookkeeping on global positions) needs no change: XLA
partitions it. Three places see across slices, each inside a `jax.shard_map` built here: the linear
ops (their `context_axis` argument carries the recurrent state across devices), the short
convolutions (`previous_halo`: the last W - 1 inputs of the previous slice) and attention
(`gather_sequence`: every slice's keys and values). A decode cache (generation) never splits T: one
device holds a whole sequence.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from flax import nnx
from jax import lax
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "context", "tensor")
BATCH_AXES = ("data", "fsdp")
CONTEXT_AXIS = "context"
HEAD_AXIS = "tensor"
_AXES_WITHIN_PROCESS = (MESH_AXES.index(CONTEXT_AXIS), MESH_AXES.index(HEAD_AXIS))

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


def make_mesh(cfg, devices=None) -> jax.sharding.Mesh:
  """cfg: the `mesh` section with sizes for data, fsdp, context, tensor; one of them may be -1 (the
  rest). A section without `context` (configs written before it existed) means context 1. devices:
  default all of jax's (a TPU slice's for an ahead-of-time compile, lineax_lm.train.aot). The
  devices are laid out along the slice's torus (jax.make_mesh) unless that runs `context` across
  processes; then `context` and `tensor` go within each process (`_host_local_layout`)."""
  sizes = [int(cfg[a]) if a != CONTEXT_AXIS or a in cfg else 1 for a in MESH_AXES]
  for axis, size in zip(MESH_AXES, sizes):
    if size < 1 and size != -1:
      raise ValueError(f"config.mesh.{axis}={size}: must be an integer >= 1, or -1 (all remaining "
                       "devices)")
  devices = jax.devices() if devices is None else devices
  n = len(devices)
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
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  try:
    mesh = jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types, devices=devices)
    if context_within_processes(mesh):
      return mesh
  except NotImplementedError:  # no assignment of the axes to the torus; a host-local one may exist
    pass
  return jax.sharding.Mesh(_host_local_layout(sizes, devices), MESH_AXES, axis_types=axis_types)


def _host_local_layout(sizes, devices) -> np.ndarray:
  """The devices as an array of `sizes` whose `context` and `tensor` axes stay within one process.

  jax.make_mesh follows the slice's physical torus, which may run an axis across hosts (a v5p-128's
  context axis of 4 along z crosses four 4-chip hosts). Each process loads whole rows, so a row's
  context slices must be on its own devices: the innermost axes (tensor, context, then what divides
  the rest of a host) go within each process and the outer ones across processes, as
  mesh_utils.create_hybrid_device_mesh lays out slices with processes as the granules."""
  processes = len({d.process_index for d in devices})
  local, within = len(devices) // processes, [1] * len(sizes)
  for i in reversed(range(len(sizes))):
    within[i] = math.gcd(sizes[i], local // math.prod(within))
  if math.prod(within) != local or any(within[i] != sizes[i] for i in _AXES_WITHIN_PROCESS):
    shape = dict(zip(MESH_AXES, sizes))
    inner = math.prod(sizes[i] for i in _AXES_WITHIN_PROCESS)
    raise ValueError(f"mesh {shape}: context * tensor = {inner} does not fit within one "
                     f"process's {local} devices, and each process loads whole rows; keep "
                     f"config.mesh.context * config.mesh.tensor a divisor of {local}")
  across = [s // w for s, w in zip(sizes, within)]
  try:
    return mesh_utils.create_hybrid_device_mesh(within, across, devices=devices, process_is_granule=True)
  except NotImplementedError as e:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} does not map onto the devices' "
                     f"physical layout: {e}") from None


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
  """The batch's [B, T] arrays: rows over (data, fsdp), time over `context`."""
  return NamedSharding(mesh, P(BATCH_AXES, CONTEXT_AXIS if CONTEXT_AXIS in mesh.axis_names else None))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _training_mesh():
  """The current mesh when it has the training axes and more than one device, else None (also
  inside a `jax.shard_map`, whose arrays are already each device's own)."""
  mesh = jax.sharding.get_abstract_mesh()
  if (mesh.empty or mesh.size == 1 or mesh.manual_axes
      or not set(BATCH_AXES + (HEAD_AXIS,)) <= set(mesh.axis_names)):
    return None
  return mesh


def _row_head_axes(mesh, rows: int, width: int):
  """Spec entries (batch, head) for arrays of `rows` rows and a head-split `width`: the mesh axes
  that divide them, else None (replicated)."""
  batch = tuple(a for a in BATCH_AXES if mesh.shape[a] > 1)
  batch = batch if batch and rows % math.prod(mesh.shape[a] for a in batch) == 0 else None
  head = HEAD_AXIS if mesh.shape[HEAD_AXIS] > 1 and width % mesh.shape[HEAD_AXIS] == 0 else None
  return batch, head


def constrain_rows(x):
  """x [B, T, ...] (the residual stream between blocks) pinned to the batch's layout: rows over
  (data, fsdp), time over `context`, the rest whole on each device. Without it XLA's sharding
  propagation may follow FSDP's parameter layout (hidden over fsdp) into the activations: on a
  v5p-8 the unscanned 340M GLA step then needed 317 GiB of temporaries a chip, rematerialised or
  not (15 GiB with the constraint). Unchanged without a training mesh."""
  mesh = _training_mesh()
  if mesh is None:
    return x
  batch, _ = _row_head_axes(mesh, x.shape[0], 1)
  context = context_axis(x.shape[1]) if x.ndim > 1 else None
  return lax.with_sharding_constraint(x, P(batch, context, *([None] * (x.ndim - 2))))


def context_axis(length: int) -> str | None:
  """CONTEXT_AXIS when the current mesh splits sequences of `length` tokens over it (its size is
  > 1 and divides `length`), else None."""
  mesh = _training_mesh()
  if mesh is None or CONTEXT_AXIS not in mesh.axis_names:
    return None
  size = mesh.shape[CONTEXT_AXIS]
  return CONTEXT_AXIS if size > 1 and length % size == 0 else None


def context_within_processes(mesh) -> bool:
  """Whether the devices along `context` of every (data, fsdp, tensor) index belong to one process:
  each process loads whole rows, so one row's slices must all be on its devices."""
  if CONTEXT_AXIS not in mesh.axis_names:
    return True
  procs = np.vectorize(lambda d: d.process_index)(mesh.devices)
  return bool((procs == np.take(procs, [0], axis=mesh.axis_names.index(CONTEXT_AXIS))).all())


def context_map(fn, args: tuple, kinds: tuple, width: int):
  """`fn(*local args)` on each device's slice of the sequence, inside `jax.shard_map` with T split
  over `context` (call it only where `context_axis(T)` is not None); returns fn's output, one
  [B, T, ...] array, its width at axis 2 split like the args'.

  `kinds[i]` says how every array of args[i] (an array, a pytree of them or None) is split: "time"
  ([B, T, ...]: rows over (data, fsdp), time over `context`, axis 2 (when there is one) over
  `tensor`), "channels" ([..., width] per-channel or per-head weights: the last axis over `tensor`),
  None (replicated), or a function of (mesh, head axis or None) giving args[i]'s PartitionSpec
  pytree (an object that shards itself, e.g. a splash-attention kernel's mask tables). `width`: the
  size of axis 2 of the "time" args; the tensor axis splits it only when it divides it."""
  return _map(fn, args, kinds, width, CONTEXT_AXIS)


def rows_heads_map(fn, args: tuple, kinds: tuple, width: int):
  """`context_map` with T whole on every device: `fn` runs on each device's rows (data, fsdp) and
  heads (tensor). Pallas kernels do not partition inside `jit`; this gives them each device's own
  arrays. Without a training mesh (or on one device) it is the plain call `fn(*args)`."""
  if _training_mesh() is None:
    return fn(*args)
  return _map(fn, args, kinds, width, None)


def _map(fn, args: tuple, kinds: tuple, width: int, time_axis: str | None):
  mesh = _training_mesh()
  B = next(a for a, kind in zip(args, kinds) if kind == "time").shape[0]
  batch, head = _row_head_axes(mesh, B, width)

  def spec(arg, kind):
    if kind == "time":
      return P(batch, time_axis, head) if arg.ndim > 2 else P(batch, time_axis)
    if kind == "channels":
      return P(*([None] * (arg.ndim - 1)), head)
    return P()
  in_specs = tuple(kind(mesh, head) if callable(kind) else
                   jax.tree_util.tree_map(lambda a, kind=kind: spec(a, kind), arg)
                   for arg, kind in zip(args, kinds))
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=P(batch, time_axis, head),
                       check_vma=False)(*args)


def slice_start(local_length: int):
  """Inside `context_map`: the global index of this device's first token."""
  return lax.axis_index(CONTEXT_AXIS) * local_length


def previous_halo(x, rows: int):
  """Inside `context_map`: the last `rows` entries along axis 1 of the previous device's slice of
  x [B, T_local, ...] (one ppermute over `context`); zeros on the first device, whose slice starts
  the sequence."""
  if rows > x.shape[1]:
    raise ValueError(f"a halo of {rows} tokens needs at least {rows} tokens per device; the "
                     f"sequence is split into slices of {x.shape[1]}: lower config.mesh.context")
  size = lax.axis_size(CONTEXT_AXIS)
  # a device that no pair sends to (the first) receives zeros
  return lax.ppermute(x[:, x.shape[1] - rows:], CONTEXT_AXIS, perm=[(i, i + 1) for i in range(size - 1)])


def gather_sequence(x):
  """Inside `context_map`: x [B, T_local, ...] of every device, concatenated along time in order
  ([B, T, ...]: one all-gather over `context`; its gradient is a reduce-scatter)."""
  return lax.all_gather(x, CONTEXT_AXIS, axis=1, tiled=True)


def shard_op(call, args: tuple, state, arrays: dict, cu_seqlens):
  """`call(args, state, arrays, cu_seqlens, context_axis) -> (o, final state or None)` under the
  current mesh.

  Pallas kernels do not partition: inside `jit` they see the global array. So under a mesh with
  the training axes the call runs inside `jax.shard_map` over the batch (data, fsdp) and head
  (tensor) axes, each device on its own rows and heads; axes that do not divide an array's size
  stay replicated. Without a state (training) the time axis is split over `context` too when it
  divides T: `context_axis` is then "context", which the call passes to the op so that the
  recurrent state flows from each slice to the next (cu_seqlens stay global offsets); otherwise None.
  `args` are time-major [B, L, H, ...] (HGRN: [B, L, D], D split like heads), `state` leaves
  [B, H, ...], `arrays` per-head [H, ...], `cu_seqlens` per row [B, ...]. Without such a mesh (or on
  one device) it is a plain call.
  """
  mesh = _training_mesh()
  if mesh is None:
    return call(args, state, arrays, cu_seqlens, None)
  heads_dim = args[0].shape[2] if args[0].ndim >= 3 else args[0].shape[-1]
  batch, head = _row_head_axes(mesh, args[0].shape[0], heads_dim)
  context = None if state is not None else context_axis(args[0].shape[1])
  timed, per_seq = P(batch, context, head), P(batch, head)
  specs_in = (tuple(timed for _ in args), None if state is None else per_seq,
              {n: P(head) for n in arrays}, None if cu_seqlens is None else P(batch))

  def local(args, state, arrays, cu_seqlens):
    return call(args, state, arrays, cu_seqlens, context)
  sharded = jax.shard_map(local, mesh=mesh, in_specs=specs_in,
                          out_specs=(timed, None if state is None else per_seq), check_vma=False)
  return sharded(args, state, arrays, cu_seqlens)
