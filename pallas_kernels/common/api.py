"""The front door of an op: argument checks, backend dispatch and the shared part of the docstring.

A family's public `chunk_<mixer>` / `fused_recurrent_<mixer>` calls `dims` (q, k, v and cu_seqlens),
`gate` / `log_decay_gate` for its other inputs, then `run`, which checks the initial state, resolves
the backend and calls `<kind>_<mixer>(*args, scale=, initial_state=, cu_seqlens=)` of that backend.
"""
from __future__ import annotations

from typing import NamedTuple

from pallas_kernels.common import checks, dispatch

COMMON_ARGS = """  scale: query scale, default K ** -0.5.
  initial_state: [N, H, K, V] (N = B, or the number of sequences with cu_seqlens).
  output_final_state: return the float32 final state [N, H, K, V] instead of None.
  cu_seqlens: int32 [N + 1] offsets of packed sequences (B == 1); the state resets at each boundary.
  backend: "auto" | "reference" | "xla" | "gpu" | "tpu".  interpret: run a Pallas kernel interpreted.
Returns:
  (o [B, T, H, V] in the input dtype, final_state or None).
"""

KINDS = {"chunk": ", chunked (training and prefill)", "fused_recurrent": ", token by token (decode)"}


def document(doc: str, **ops):
  """Sets the docstring of each op (keyword: its kind) to `doc` + COMMON_ARGS, with "{kind}" replaced
  by a phrase ("..., chunked (training and prefill)") and "{fla}" by the kind ("chunk")."""
  for kind, fn in ops.items():
    fn.__doc__ = doc.replace("{kind}", KINDS[kind]).replace("{fla}", kind) + COMMON_ARGS


class Dims(NamedTuple):
  B: int
  T: int
  H: int
  K: int
  V: int
  N: int  # number of sequences: B, or len(cu_seqlens) - 1


def dims(q, k, v, cu_seqlens, q_name: str = "q") -> Dims:
  """Checks q, k [B, T, H, K], v [B, T, H, V] and cu_seqlens; returns the sizes."""
  B, T, H, K, V = checks.check_qkv(q, k, v, q_name)
  return Dims(B, T, H, K, V, checks.num_sequences(B, T, cu_seqlens))


def gate(name: str, x, d: Dims, layout: str, optional: bool = False):
  """Checks that `x` has `layout` (e.g. "[B, T, H, K]", sizes from `d`); None passes if optional."""
  if x is None and optional:
    return None
  expected = tuple(getattr(d, axis) for axis in layout.strip("[]").split(", "))
  checks.check_rank(name, x, len(expected), layout)
  checks.check_shape(name, x, expected, layout)
  return x


def log_decay_gate(name: str, x, d: Dims, layout: str, optional: bool = False):
  """`gate`, then the log-decay check (<= 0: error when concrete, clamped under jit)."""
  return checks.log_decay(name, gate(name, x, d, layout, optional))


def run(family: str, kind: str, d: Dims, args: tuple, *, scale, initial_state, output_final_state,
        cu_seqlens, backend, interpret):
  """Checks the initial state, dispatches, and returns (o, final_state or None). A Pallas backend
  module may define `unsupported(*args) -> reason or None` to decline inputs (see dispatch.resolve)."""
  checks.check_state("initial_state", initial_state, (d.N, d.H, d.K, d.V), "[N, H, K, V]")
  fn = dispatch.resolve(family, kind, backend, interpret,
                        supports=lambda mod: getattr(mod, "unsupported", lambda *a: None)(*args))
  o, S = fn(*args, scale=d.K ** -0.5 if scale is None else scale, initial_state=initial_state,
            cu_seqlens=cu_seqlens)
  return o, S if output_final_state else None
