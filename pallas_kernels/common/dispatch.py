"""Backend dispatch: every public op resolves its implementation here, never in the layers.

Each family folder holds backend modules named after the backend (`reference.py`, `xla.py`,
`gpu.py`, `tpu.py`); a module implements an op kind by defining `chunk_<mixer>` and/or
`fused_recurrent_<mixer>`. `backend="auto"` takes the Pallas kernel of the current platform when the
family has one, and the xla path otherwise (always on CPU). A Pallas module that sets `AUTO = False`
is opt-in: it runs only under an explicit `backend=`, because it has not yet been compiled and timed
on that platform's hardware (interpret mode proves it correct, not that it compiles fast or beats
the xla path there).
"""
from __future__ import annotations

import functools
import importlib
import warnings

import jax

BACKENDS = ("auto", "reference", "xla", "gpu", "tpu")
PALLAS_BACKENDS = ("gpu", "tpu")


def platform() -> str:
  p = jax.default_backend()
  return {"cuda": "gpu", "rocm": "gpu"}.get(p, p)


@functools.cache
def _module(family: str, backend: str):
  try:
    return importlib.import_module(f"pallas_kernels.{family}.{backend}")
  except ModuleNotFoundError as e:
    if e.name != f"pallas_kernels.{family}.{backend}":
      raise
    return None


def _find(family: str, backend: str, kind: str, mixer: str):
  mod = _module(family, backend)
  return None if mod is None else getattr(mod, f"{kind}_{mixer}", None)


def resolve(family: str, kind: str, backend: str = "auto", interpret: bool = False,
            mixer: str | None = None, supports=None):
  """Returns the implementation of `<kind>_<mixer>` for `backend`.

  `supports(backend_module) -> str | None` lets a family reject shapes a kernel cannot handle: with
  backend="auto" the op falls back to xla with a warning; an explicit Pallas backend raises.
  """
  mixer = mixer or family
  if backend not in BACKENDS:
    raise ValueError(f"`backend` must be one of {BACKENDS}; got {backend!r}")
  explicit = backend != "auto"
  if backend == "auto":
    backend = platform() if platform() in PALLAS_BACKENDS else "xla"
    if backend in PALLAS_BACKENDS and not auto_selects(family, backend):
      backend = "xla"
  fn = _find(family, backend, kind, mixer)
  if fn is None:
    if explicit and backend in PALLAS_BACKENDS:
      raise ValueError(f"`backend={backend!r}`: {kind}_{mixer} has no Pallas {backend} kernel yet; "
                       "use backend='auto' or 'xla'")
    backend, fn = "xla", _find(family, "xla", kind, mixer)
  if fn is None:
    raise ValueError(f"{kind}_{mixer} has no {backend!r} implementation")
  if backend in PALLAS_BACKENDS:
    reason = supports(_module(family, backend)) if supports else None
    if reason:
      if explicit:
        raise ValueError(f"`backend={backend!r}` cannot run {kind}_{mixer} here: {reason}")
      warnings.warn(f"{kind}_{mixer}: falling back to the xla path ({reason})", stacklevel=3)
      return _find(family, "xla", kind, mixer)
    return functools.partial(fn, interpret=interpret)
  return fn


def auto_selects(family: str, backend: str) -> bool:
  """Whether `backend="auto"` may take this Pallas backend's module (see `AUTO` above)."""
  mod = _module(family, backend)
  return mod is not None and getattr(mod, "AUTO", True)


FAMILIES = ("linear_attn", "retention", "simple_gla", "gla", "rwkv6", "delta_rule", "gated_delta_rule",
            "kda", "hgrn", "mlstm")
KINDS = ("chunk", "fused_recurrent")
IMPLEMENTATIONS = ("xla", "gpu", "tpu")  # "reference" defines every op; auto picks among these


def support_table() -> dict[tuple[str, str, str], bool]:
  """(family, kind, backend) -> whether that backend module defines the op itself (no fallback)."""
  return {(f, kind, b): _find(f, b, kind, f) is not None
          for f in FAMILIES for kind in KINDS for b in IMPLEMENTATIONS}


def support_markdown() -> str:
  """`support_table` as the README's table: one row a family, "yes" or "-" per kind and backend."""
  table = support_table()
  head = " / ".join(IMPLEMENTATIONS)
  lines = [f"| family | `chunk_*`: {head} | `fused_recurrent_*`: {head} |", "|---|---|---|"]
  for f in FAMILIES:
    cells = [" / ".join("yes" if table[f, kind, b] else "-" for b in IMPLEMENTATIONS) for kind in KINDS]
    lines.append(f"| `{f}` | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)
