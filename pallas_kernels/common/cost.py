"""The `cost_estimate` of every pallas_call, so XLA's scheduler and `compiled.cost_analysis()` see
what a kernel computes instead of nothing (a custom call is free to XLA unless it is told).

`kernel_cost` traces the pallas_call and counts the jaxpr of its kernel (one grid step, on refs of
the block shapes): a dot_general is 2 * M * N * K flops, an elementwise arithmetic op one flop per
element, exp/log/tanh/... one transcendental per element; loops count their body once per trip and
`pl.when` branches count in full (an upper bound: a chunk kernel takes them on some steps only).
The per-step counts times the grid size are the kernel's; bytes are every operand read once and
every result written once (the traffic a kernel streaming its blocks through VMEM or shared memory
has; re-read blocks are not counted).
"""
from __future__ import annotations

import math

import jax
from jax.experimental import pallas as pl
from jax.extend import core as jax_core

# Elementwise primitives counted as one flop per output element; the transcendental ones as one
# transcendental per element (what `pl.CostEstimate` means by transcendentals).
ARITHMETIC = frozenset({"add", "sub", "mul", "div", "max", "min", "neg", "abs", "square",
                        "integer_pow", "reduce_sum", "reduce_max", "reduce_min", "cumsum",
                        "select_n", "sign", "rem"})
TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt",
                            "rsqrt", "pow", "sin", "cos", "erf"})


def _size(aval) -> int:
  return math.prod(getattr(aval, "shape", ()))


def _sub_jaxprs(eqn, loop_trips):
  """(jaxpr, multiplicity) of each sub-computation of a higher-order primitive."""
  params, name = eqn.params, eqn.primitive.name
  if name == "scan":
    return [(params["jaxpr"].jaxpr, params["length"])]
  if name == "while":
    return [(params["body_jaxpr"].jaxpr, _while_trips(eqn, loop_trips)),
            (params["cond_jaxpr"].jaxpr, 1)]
  if name == "cond":  # the costliest branch (pl.when: the branch or nothing)
    costliest = max(params["branches"], key=lambda b: _count(b.jaxpr, loop_trips)[0])
    return [(costliest.jaxpr, 1)]
  subs = []
  for value in params.values():
    inner = getattr(value, "jaxpr", value)
    if isinstance(inner, jax_core.Jaxpr):
      subs.append((inner, 1))
  return subs


def _while_trips(eqn, loop_trips) -> int:
  """The trip count of a `fori_loop` lowered to a while loop: its bounds when they are literals,
  else `loop_trips` (bounds read from refs at run time), else 1."""
  lo, hi = eqn.invars[eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]:][:2]
  if isinstance(lo, jax_core.Literal) and isinstance(hi, jax_core.Literal):
    return max(int(hi.val) - int(lo.val), 0)
  return 1 if loop_trips is None else loop_trips


def _count(jaxpr, loop_trips=None) -> tuple[int, int]:
  """(flops, transcendentals) of one run of `jaxpr`."""
  flops = transcendentals = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      depth = math.prod(eqn.invars[0].aval.shape[d] for d in lhs_contract)
      flops += 2 * _size(eqn.outvars[0].aval) * depth
    elif name in ARITHMETIC:
      flops += _size(eqn.invars[0].aval if name.startswith("reduce") else eqn.outvars[0].aval)
    elif name in TRANSCENDENTAL:
      transcendentals += _size(eqn.outvars[0].aval)
    else:
      for sub, times in _sub_jaxprs(eqn, loop_trips):
        f, t = _count(sub, loop_trips)
        flops, transcendentals = flops + times * f, transcendentals + times * t
  return flops, transcendentals


def _nbytes(aval) -> int:
  return _size(aval) * aval.dtype.itemsize


def kernel_cost(call, *operands, loop_trips: int | None = None) -> pl.CostEstimate:
  """The `pl.CostEstimate` of `call(*operands)`, `call` a `pl.pallas_call(...)` built without one:
  the counts of the kernel's traced body (one grid step) times the grid size; bytes: operands read
  once, results written once. `loop_trips`: the trip count of the kernel's loops whose bounds are
  read at run time (a decode kernel's tokens per sequence), which the trace cannot see.

  A site builds the call twice: `call = functools.partial(pl.pallas_call, kernel, ...)`, then
  `call(cost_estimate=kernel_cost(call(), *args))(*args)`. An absent operand (None: the kernel
  gets a None ref) stays None."""
  structs = [None if x is None else jax.ShapeDtypeStruct(x.shape, x.dtype) for x in operands]
  (eqn,) = [e for e in jax.make_jaxpr(call)(*structs).jaxpr.eqns if e.primitive.name == "pallas_call"]
  flops, transcendentals = _count(eqn.params["jaxpr"], loop_trips)
  steps = math.prod(eqn.params["grid_mapping"].grid)
  moved = sum(_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars))
  return pl.CostEstimate(flops=int(steps * flops), transcendentals=int(steps * transcendentals),
                         bytes_accessed=int(moved))
