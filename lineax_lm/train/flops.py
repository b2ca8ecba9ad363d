"""The FLOPs of a traced program, counted from its jaxpr, for the ahead-of-time roofline.

XLA's `cost_analysis()` of a compiled step counts the body of a loop once: with the layers as a
scan (`scan_layers`) it reports a fraction of the step's work (a 24-layer step about what two
layers cost). Here the program's jaxpr is walked instead: each `dot_general` costs 2 x the product
of its output's dims x its contracting dims; each `pallas_call` its `cost_estimate` (every kernel in
`pallas_kernels` declares one); a `scan` its body times its length; a `cond` its dearest branch;
a `shard_map` its per-device body times the devices it runs on; other primitives that hold a
jaxpr (jit, remat, custom derivatives) their body once. Elementwise work is left out: on a TPU it
rides under the matmuls, and the convention for MFU counts matmul FLOPs. A `while` loop whose trip
count is not static is counted once (the step has none: `fori_loop` with static bounds is a scan).
"""
from __future__ import annotations

import math

from jax.extend import core


def jaxpr_flops(jaxpr) -> float:
  """FLOPs of `jaxpr` (a Jaxpr or ClosedJaxpr) over the whole mesh, by the rules above."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name, params = eqn.primitive.name, eqn.params
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name == "pallas_call":
      estimate = params.get("cost_estimate")
      total += float(estimate.flops) if estimate is not None else 0.0
    elif name == "scan":
      total += params["length"] * jaxpr_flops(params["jaxpr"])
    elif name == "cond":
      total += max(jaxpr_flops(branch) for branch in params["branches"])
    elif name == "while":
      total += jaxpr_flops(params["body_jaxpr"]) + jaxpr_flops(params["cond_jaxpr"])
    elif name == "shard_map":
      mesh, axes = params["mesh"], params.get("manual_axes") or params["mesh"].axis_names
      total += math.prod(mesh.shape[a] for a in axes) * jaxpr_flops(params["jaxpr"])
    else:
      for sub in _subjaxprs(params):
        total += jaxpr_flops(sub)
  return total


def _dot_flops(eqn) -> float:
  (lhs_contract, _), _ = eqn.params["dimension_numbers"]
  lhs = eqn.invars[0].aval.shape
  out = eqn.outvars[0].aval.shape
  return 2.0 * math.prod(out) * math.prod(lhs[d] for d in lhs_contract)


def _subjaxprs(params):
  """The jaxprs a primitive's parameters hold (jit's `jaxpr`, remat's, custom_jvp's `call_jaxpr`);
  a custom derivative's rule functions are not jaxprs and are not counted."""
  for value in params.values():
    if isinstance(value, (core.Jaxpr, core.ClosedJaxpr)):
      yield value
