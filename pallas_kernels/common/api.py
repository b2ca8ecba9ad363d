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
from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels.common import checks, context, dispatch

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
    return tuple(getattr(self, axis) for axis in layout.strip("[]").split(", "))


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


def dims(q, k, v, cu_seqlens, q_name: str = "q", context_axis: str | None = None) -> Dims:
  """Checks q, k [B, T, H, K], v [B, T, H, V] and cu_seqlens (global offsets under context_axis,
  where T is the local slice's length); returns the sizes."""
  B, T, H, K, V = checks.check_qkv(q, k, v, q_name)
  return Dims(B, T, H, K, V, checks.num_sequences(B, context.global_length(T, cu_seqlens, context_axis),
                                                  cu_seqlens))


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
        transition: context.Transition | None = None, **options):
  """Makes the initial state concrete, dispatches, and returns (o, final_state or None).

  `options` go to the backend as keywords; `scale=None` becomes the default K ** -0.5. A Pallas
  backend module may define `unsupported(*args) -> reason or None` to decline inputs (see
  dispatch.resolve). With `context_axis`, T is split over that mesh axis and `common.context.run`
  wraps the backend, with the family's `transition`.
  """
  h0 = concrete_state(initial_state, state, d)
  if "scale" in options and options["scale"] is None:
    options["scale"] = d.K ** -0.5
  checks.check_scale(options.get("scale"))

  def call(args, initial_state, cu_seqlens):
    fn = dispatch.resolve(family, kind, backend, interpret,
                          supports=lambda mod: getattr(mod, "unsupported", lambda *a: None)(*args))
    return fn(*args, initial_state=initial_state, cu_seqlens=cu_seqlens, **options)

  if context_axis is not None:
    return context.run(transition, call, args, h0, cu_seqlens, context_axis,
                       output_final_state=output_final_state, scale=options.get("scale"))
  o, S = call(args, h0, cu_seqlens)
  return o, S if output_final_state else None


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
