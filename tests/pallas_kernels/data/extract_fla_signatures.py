"""Writes fla_0_6_0_signatures.json: the signatures of flash-linear-attention 0.6.0's ops for the
families pallas_kernels mirrors, read from fla's own source with `ast` (nothing is imported, so no
torch or Triton is needed). test_fla_signatures.py compares every op of pallas_kernels with it.

Regenerate (fla's ops ship in the fla-core wheel):
  pip download --no-deps flash-linear-attention==0.6.0 fla-core==0.6.0 -d /tmp/fla
  python tests/pallas_kernels/data/extract_fla_signatures.py /tmp/fla/fla_core-0.6.0-py3-none-any.whl \
    > tests/pallas_kernels/data/fla_0_6_0_signatures.json
"""
from __future__ import annotations

import ast
import json
import sys
import zipfile

# fla.ops subpackages with a pallas_kernels counterpart (mLSTM has none in fla).
FAMILIES = ("delta_rule", "gated_delta_rule", "gla", "hgrn", "kda", "linear_attn", "retention",
            "rwkv6", "simple_gla")


def exports(wheel: zipfile.ZipFile, family: str) -> dict[str, str]:
  """Public name -> module file of fla.ops.<family>: its `__all__`, resolved through the
  `from .module import name` lines of its __init__.py (fla's naive_* references left out)."""
  tree = ast.parse(wheel.read(f"fla/ops/{family}/__init__.py"))
  public = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
  where = {alias.name: f"fla/ops/{family}/{n.module}.py" for n in tree.body
           if isinstance(n, ast.ImportFrom) and n.level == 1 for alias in n.names}
  return {name: where[name] for name in public if not name.startswith("naive_")}


def function(tree: ast.Module, name: str) -> ast.FunctionDef:
  """The top-level def of `name`, following a module-level alias (`chunk_gdn = chunk_gated_delta_rule`)."""
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == name:
      return node
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
      return function(tree, node.value.id)
  raise LookupError(f"no top-level def of {name}")


def signature(fn: ast.FunctionDef) -> dict:
  """Whether the function takes **kwargs, and its parameters in order as [name, kind, default]
  (the default's source text; null when there is none)."""
  a = fn.args
  positional = [(p, "positional_only") for p in a.posonlyargs] + [(p, "positional_or_keyword") for p in a.args]
  defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
  params = [[p.arg, kind, d] for (p, kind), d in zip(positional, defaults)]
  if a.vararg:
    params.append([a.vararg.arg, "var_positional", None])
  params += [[p.arg, "keyword_only", None if d is None else ast.unparse(d)]
             for p, d in zip(a.kwonlyargs, a.kw_defaults)]
  return {"var_keyword": a.kwarg is not None, "params": params}


def dump(data: dict) -> str:
  """JSON with one line per op field and per parameter (small diffs when fla changes a signature)."""
  lines = ["{", f' "source": {json.dumps(data["source"])},', ' "ops": {']
  for i, (name, op) in enumerate(data["ops"].items()):
    params = ",\n".join(f"    {json.dumps(p)}" for p in op["params"])
    lines.append(f'  {json.dumps(name)}: {{\n   "module": {json.dumps(op["module"])},\n'
                 f'   "var_keyword": {json.dumps(op["var_keyword"])},\n   "params": [\n{params}\n   ]\n  }}'
                 + ("," if i + 1 < len(data["ops"]) else ""))
  return "\n".join(lines + [" }", "}", ""])


def main(path: str):
  with zipfile.ZipFile(path) as wheel:
    version = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    ops = {}
    for family in FAMILIES:
      for name, module in exports(wheel, family).items():
        ops[name] = {"module": module, **signature(function(ast.parse(wheel.read(module)), name))}
  source = version.split("/")[0].removesuffix(".dist-info")
  sys.stdout.write(dump({"source": source, "ops": dict(sorted(ops.items()))}))


if __name__ == "__main__":
  main(*sys.argv[1:])
