"""The front door of every op: argument checks, the initial state, backend dispatch and the shared
part of the docstring, written once for the ten families.

A family's public `chunk_<mixer>` / `fused_recurrent_<mixer>` calls `dims` (q, k, v and cu_seqlens;
`elementwise_dims` for [B, T, D] ops), `gate` / `log_decay_gate` for its other inputs, then `run`,
which checks the initial state against the family's `State`, makes it concrete (float32 zeros when
None), resolves the backend and calls `<kind>_<mixer>(*args, initial_state=, cu_seqlens=, scale=)`
of that backend. So a backend never sees `initial_state=None`, and the sequence count is the state's
leading axis. With `context_axis`, `run` hands the resolved backend to `common.context.run`, which
splits the sequence over that mesh axis (see its docstring).
"""
from __future__ import annotations

import textwrap
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.common import checks, context, dispatch, segments

F32 = jnp.float32


class Dims(NamedTuple):
  """Sizes of an op's inputs, by the letters its layouts use ("[B, T, H, K]")."""
  B: int
  T: int
  H: int | None
  K: int | None
  V: int | None
  N: int  # number of sequences: B, or len(cu_seqlens) - 1
  D: int | None = None  # width of elementwise ops ([B, T, D])

  def shape(self, layout: str) -> tuple[int, ...]:
    return tuple(int(axis) if axis.isdigit() else getattr(self, axis)
                 for axis in layout.strip("[]").split(", "))


class State(NamedTuple):
  """The recurrent state of a family: one layout per leaf; `names` is None for a single array, else
  the state is the tuple of leaves with these names."""
  layouts: tuple[str, ...]
  names: tuple[str, ...] | None = None

  def describe(self) -> str:
    if self.names is None:
      return self.layouts[0]
    return "the tuple (" + ", ".join(f"{n} {l}" for n, l in zip(self.names, self.layouts)) + ")"


MATRIX = State(("[N, H, K, V]",))  # the K x V state of every linear-attention family
V_FIRST = State(("[N, H, V, K]",))  # the same with fla's state_v_first=True


def dims(q, k, v, cu_seqlens, q_name: str = "q", context_axis: str | None = None) -> Dims:
  """Checks q, k [B, T, H, K], v [B, T, H, V] and cu_seqlens (global offsets under context_axis,
  where T is the local slice's length); returns the sizes."""
  B, T, H, K, V = checks.check_qkv(q, k, v, q_name)
  return Dims(B, T, H, K, V, checks.num_sequences(B, context.global_length(T, cu_seqlens, context_axis),
                                                  cu_seqlens))


def grouped_value_heads(q, k, v):
  """fla's grouped value attention (GVA) of the delta rules: v (with the gates, beta and the state)
  has HV heads, a multiple of the H heads of q and k, and q, k head h serves the HV / H value heads
  from h HV / H on. q and k are repeated to HV heads here (their gradients sum back), so every
  backend runs it; other shapes pass through to the shape checks."""
  if getattr(q, "ndim", None) != 4 or getattr(v, "ndim", None) != 4 or v.shape[2] == q.shape[2]:
    return q, k
  H, HV = q.shape[2], v.shape[2]
  if HV % H:
    raise ValueError(f"`v` has {HV} heads, not a multiple of the {H} heads of q and k (grouped value "
                     "heads need HV % H == 0)")
  return jnp.repeat(q, HV // H, axis=2), jnp.repeat(k, HV // H, axis=2)


def elementwise_dims(x, cu_seqlens, name: str = "x", context_axis: str | None = None) -> Dims:
  """Checks x [B, T, D] (a floating array) and cu_seqlens; returns the sizes (H = K = V = None)."""
  checks.check_rank(name, x, 3, "[B, T, D]")
  checks.check_floating(name, x)
  B, T, D = x.shape
  return Dims(B, T, None, None, None, checks.num_sequences(
      B, context.global_length(T, cu_seqlens, context_axis), cu_seqlens), D)


def gate(name: str, x, d: Dims, layout: str, optional: bool = False):
  """Checks that `x` is a floating array with `layout` (e.g. "[B, T, H, K]", sizes from `d`); None
  passes if optional."""
  if x is None and optional:
    return None
  expected = d.shape(layout)
  checks.check_rank(name, x, len(expected), layout)
  checks.check_shape(name, x, expected, layout)
  checks.check_floating(name, x)
  return x


def log_decay_gate(name: str, x, d: Dims, layout: str, optional: bool = False):
  """`gate`, then the log-decay check (<= 0: error when concrete, clamped under jit)."""
  return checks.log_decay(name, gate(name, x, d, layout, optional))


def concrete_state(state, spec: State, d: Dims):
  """Checks `state` against `spec` and returns it in float32, or float32 zeros when None."""
  shapes = [d.shape(layout) for layout in spec.layouts]
  if spec.names is None:
    if state is None:
      return jnp.zeros(shapes[0], F32)
    checks.check_state("initial_state", state, shapes[0], spec.layouts[0])
    return state.astype(F32)
  if state is None:
    return tuple(jnp.zeros(s, F32) for s in shapes)
  if not isinstance(state, (tuple, list)) or len(state) != len(spec.names):
    raise ValueError(f"`initial_state` must be {spec.describe()}; got {type(state).__name__}"
                     + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else ""))
  for name, layout, shape, s in zip(spec.names, spec.layouts, shapes, state):
    checks.check_state(f"initial_state {name}", s, shape, layout)
  return tuple(s.astype(F32) for s in state)


def run(family: str, kind: str, d: Dims, args: tuple, *, initial_state, output_final_state,
        cu_seqlens, backend, interpret, state: State = MATRIX, context_axis: str | None = None,
        transition: context.Transition | None = None, reverse: bool = False,
        state_v_first: bool = False, **options):
  """Makes the initial state concrete, dispatches, and returns (o, final_state or None).

  `options` go to the backend as keywords; `scale=None` becomes the default K ** -0.5. A Pallas
  backend module may define `unsupported(*args) -> reason or None` to decline inputs (see
  dispatch.resolve). With `context_axis`, T is split over that mesh axis and `common.context.run`
  wraps the backend, with the family's `transition`; under `segments.segment_parallel` a chunked
  op runs on segments of T side by side (`common.segments`). fla's `reverse` and `state_v_first`
  are done here for every backend: `reverse` reads every sequence backwards (see `run_reversed`),
  `state_v_first` takes and returns the matrix state as [N, H, V, K].
  """
  if state_v_first:
    h0 = jnp.swapaxes(concrete_state(initial_state, V_FIRST, d), -1, -2)
  else:
    h0 = concrete_state(initial_state, state, d)
  if "scale" in options and options["scale"] is None:
    options["scale"] = d.K ** -0.5
  checks.check_scale(options.get("scale"))

  def call(args, initial_state, cu_seqlens):
    fn = dispatch.resolve(family, kind, backend, interpret,
                          supports=lambda mod: getattr(mod, "unsupported", lambda *a: None)(*args))
    return fn(*args, initial_state=initial_state, cu_seqlens=cu_seqlens, **options)

  if reverse:
    if context_axis is not None:
      raise ValueError("`reverse=True` cannot be combined with `context_axis` (the slices would run "
                       "in the opposite device order); reverse the inputs before splitting them")
    o, S = run_reversed(call, args, h0, cu_seqlens)
  elif context_axis is not None:
    o, S = context.run(transition, call, args, h0, cu_seqlens, context_axis,
                       output_final_state=output_final_state, scale=options.get("scale"))
  elif (n := segments.count(kind, d.B, d.T, d.H, transition)) > 1:
    o, S = segments.run(transition, call, args, h0, cu_seqlens, n,
                        output_final_state=output_final_state, scale=options.get("scale"))
  else:
    o, S = call(args, h0, cu_seqlens)
  if not output_final_state:
    return o, None
  return o, jnp.swapaxes(S, -1, -2) if state_v_first else S


def run_reversed(call, args: tuple, initial_state, cu_seqlens):
  """fla's `reverse=True`: every sequence read from its last token to its first, as `call(args,
  initial_state, cu_seqlens) -> (o, final_state)` computes it on the time-flipped inputs (those of
  rank >= 3, [B, T, ...]; per-head inputs such as RWKV-6's u stay). With cu_seqlens the packed
  sequences come out in the opposite order, so their offsets and states are flipped too."""
  T = args[0].shape[1]
  flipped = tuple(jnp.flip(x, 1) if segments.is_time_major(x) else x for x in args)
  if cu_seqlens is None:
    o, S = call(flipped, initial_state, None)
    return jnp.flip(o, 1), S
  by_sequence = lambda tree: jax.tree_util.tree_map(lambda s: jnp.flip(s, 0), tree)
  cu = (T - jnp.flip(cu_seqlens)).astype(cu_seqlens.dtype)
  o, S = call(flipped, by_sequence(initial_state), cu)
  return jnp.flip(o, 1), by_sequence(S)


def fla_kwargs(op: str, kwargs: dict, *, state_v_first: bool | None = None, takes: tuple = ()):
  """The `**kwargs` of an fla op, read as fla reads them. `head_first=False` warns (fla removed the
  option; [B, T, H, ...] is the only layout) and `head_first=True` raises. `transpose_state_layout`
  (ops with `state_v_first`) warns and stands for `state_v_first`, as in fla. `chunk_size` is
  accepted where fla pops it (a power of two): the backends choose their own chunk length, and
  the result does not depend on it. `takes` names the keywords the op reads from its kwargs (e.g.
  chunk_gated_delta_rule's `A_log`). Any other keyword raises a TypeError (fla ignores it).
  Returns (state_v_first, {name: value} for the names in `takes`)."""
  kwargs = dict(kwargs)
  if "head_first" in kwargs:
    if kwargs.pop("head_first"):
      raise ValueError(f"{op}: `head_first=True` ([B, H, T, ...] inputs) has been removed, as in fla; "
                       "pass [B, T, H, ...]")
    warnings.warn("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.",
                  DeprecationWarning, stacklevel=3)
  if state_v_first is not None and "transpose_state_layout" in kwargs:
    if state_v_first:
      raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                  DeprecationWarning, stacklevel=3)
    state_v_first = kwargs.pop("transpose_state_layout")
  if op.startswith("chunk_") and "chunk_size" in kwargs:
    size = kwargs.pop("chunk_size")
    if size is not None and not (isinstance(size, int) and size > 0 and size & (size - 1) == 0):
      raise ValueError(f"{op}: `chunk_size` must be a power of 2; got {size!r}")
  taken = {name: kwargs.pop(name) for name in takes if name in kwargs}
  if kwargs:
    raise TypeError(f"{op}() got an unexpected keyword argument {next(iter(kwargs))!r}")
  return state_v_first, taken


def only_on_scan(option: str, backend: str, context_axis) -> str:
  """The backend for an option only the float32 scan implements (fla's `gv`): "auto" takes "xla"
  (whose fused_recurrent_* is the scan), "xla" and "reference" stay; a Pallas backend or
  context_axis raises, naming the option."""
  if backend in dispatch.PALLAS_BACKENDS:
    raise ValueError(f"`{option}` is not supported by backend={backend!r}: only the reference scan "
                     "implements it; use backend='xla' or 'reference'")
  if context_axis is not None:
    raise ValueError(f"`{option}` cannot be combined with `context_axis`")
  return "xla" if backend == "auto" else backend


def delta_beta(beta, d: Dims, kind: str):
  """The delta rules' beta: [B, T, H], or for fused_recurrent (as fla's decode kernels take it)
  [B, T, H, V], a write strength per value channel. Returns (beta, whether it is per channel)."""
  per_channel = kind == "fused_recurrent" and getattr(beta, "ndim", None) == 4
  return gate("beta", beta, d, "[B, T, H, V]" if per_channel else "[B, T, H]"), per_channel


def beta_activation(beta, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool):
  """fla's in-kernel beta: sigmoid(beta) (2 sigmoid(beta) with allow_neg_eigval, eigenvalues of the
  transition in (-1, 1)) in float32, else beta as given."""
  if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
    raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
  if not use_beta_sigmoid_in_kernel:
    return beta
  return jax.nn.sigmoid(beta.astype(F32)) * (2.0 if allow_neg_eigval else 1.0)


KIND_PHRASES = {"chunk": ", chunked (training and prefill)", "fused_recurrent": ", token by token (decode)"}


def common_args(state: State = MATRIX, scale: bool = True) -> str:
  """The Args lines every op shares, after its own inputs, and its Returns."""
  o_layout = "[B, T, D]" if "D" in state.layouts[0] else "[B, T, H, V]"
  state_line = textwrap.fill(f"initial_state: {state.describe()} (N = B, or the number of sequences "
                             "with cu_seqlens); default zeros.", 98, initial_indent="  ",
                             subsequent_indent="    ")
  return ("  scale: query scale, default K ** -0.5.\n" if scale else "") + state_line + f"""
  output_final_state: return the float32 final state (same layout) instead of None.
  cu_seqlens: int32 [N + 1] offsets of packed sequences (B == 1); the state resets at each boundary.
  Where the op takes them, as in fla: reverse: read every sequence from its last token to its
    first. state_v_first: initial and final states as [N, H, V, K]. cu_seqlens_cpu: accepted, not
    needed (concrete cu_seqlens are checked as they are). **kwargs: head_first=False and
    transpose_state_layout warn as in fla, chunk_size is accepted, another keyword raises.
  backend: "auto" | "reference" | "xla" | "gpu" | "tpu".  interpret: run a Pallas kernel interpreted.
  context_axis: None, or a mesh axis bound here (inside jax.shard_map) over which T is split into
    contiguous equal slices: pass this device's slice of every [B, T, ...] input and get its slice of
    o; initial_state, cu_seqlens (global offsets) and the final state are the same on every device.
Returns:
  (o {o_layout} in the input dtype, final_state or None).
"""


def document(doc: str, *, state: State = MATRIX, scale: bool = True, **ops):
  """Sets the docstring of each op (keyword: its kind) to `doc` + `common_args`, with "{kind}"
  replaced by a phrase (", chunked (training and prefill)") and "{fla}" by the kind ("chunk")."""
  for kind, fn in ops.items():
    fn.__doc__ = doc.replace("{kind}", KIND_PHRASES[kind]).replace("{fla}", kind) + common_args(state, scale)
