"""Every exported op of pallas_kernels against flash-linear-attention 0.6.0's signature of the same
name: parameter names, order, kinds, defaults and **kwargs. fla's signatures come from its own
source (data/fla_0_6_0_signatures.json, written by data/extract_fla_signatures.py, which says how to
regenerate it), so this runs without torch or Triton. Every difference must be a row, with its
reason, of the table in docs/DESIGN.md ("Differences from fla 0.6.0"), and every row a difference:
the docs and the ops cannot drift apart."""
import ast
import inspect
import json
import pathlib
import re

import pytest

import pallas_kernels

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLA = json.loads((pathlib.Path(__file__).parent / "data" / "fla_0_6_0_signatures.json").read_text())["ops"]
DESIGN = ROOT / "docs" / "DESIGN.md"
TABLE_MARK = "<!-- fla 0.6.0 signature differences: tests/pallas_kernels/test_fla_signatures.py -->"
# lineax_lm's own arguments: keyword-only, after fla's, in every op.
EXTRAS = {"backend": "auto", "interpret": False, "context_axis": None}
KINDS = {inspect.Parameter.POSITIONAL_ONLY: "positional_only",
         inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
         inspect.Parameter.VAR_POSITIONAL: "var_positional",
         inspect.Parameter.KEYWORD_ONLY: "keyword_only"}
NO_DEFAULT = inspect.Parameter.empty


def shown(default) -> str:
  return "none" if default is NO_DEFAULT else repr(default)


def ours(fn) -> tuple[list, bool]:
  """([name, kind, default (NO_DEFAULT when none)] of every parameter but the extras, takes **kwargs)."""
  params = inspect.signature(fn).parameters.values()
  listed = [[p.name, KINDS[p.kind], p.default]
            for p in params if p.kind != p.VAR_KEYWORD and p.name not in EXTRAS]
  return listed, any(p.kind == p.VAR_KEYWORD for p in params)


def op_differences(name: str, fn, fla: dict) -> set[tuple[str, str, str]]:
  mine, var_keyword = ours(fn)
  theirs = {n: (kind, NO_DEFAULT if d is None else ast.literal_eval(d)) for n, kind, d in fla["params"]}
  found = set()
  for n, kind, default in mine:
    if n not in theirs:
      found.add((name, n, f"extra, {kind.replace('_', '-')}"))
      continue
    fla_kind, fla_default = theirs[n]
    if kind != fla_kind:
      found.add((name, n, f"{kind.replace('_', '-')} (fla: {fla_kind.replace('_', '-')})"))
    if default != fla_default or type(default) is not type(fla_default):
      found.add((name, n, f"default {shown(default)} (fla: {shown(fla_default)})"))
  found |= {(name, n, "missing") for n in theirs if n not in {m[0] for m in mine}}
  common = [n for n, *_ in mine if n in theirs]
  if common != [n for n in theirs if n in common]:
    found.add((name, "", "order"))
  if var_keyword != fla["var_keyword"]:
    found.add((name, "**kwargs", "missing" if fla["var_keyword"] else "extra"))
  return found


def differences() -> set[tuple[str, str, str]]:
  found = set()
  for name in pallas_kernels.__all__:
    if name in FLA:
      found |= op_differences(name, getattr(pallas_kernels, name), FLA[name])
    else:
      found.add((name, "", "not in fla"))
  return found | {(name, "", "not provided") for name in FLA if name not in pallas_kernels.__all__}


def documented() -> dict[tuple[str, str, str], str]:
  """The table after TABLE_MARK in DESIGN.md: (op, argument, difference) -> reason."""
  text = DESIGN.read_text()
  assert TABLE_MARK in text, f"{DESIGN} has no table marked {TABLE_MARK}"
  rows = {}
  for line in text.split(TABLE_MARK, 1)[1].lstrip("\n").splitlines()[2:]:
    if not line.startswith("|"):
      break
    cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
    assert len(cells) == 4, f"a row of the fla differences table needs 4 cells: {line}"
    op, argument, difference, reason = cells
    rows[op, "" if argument == "-" else argument, difference] = reason
  return rows


def markdown(rows) -> str:
  return "\n".join(f"| `{op}` | {f'`{a}`' if a else '-'} | {d} | |" for op, a, d in sorted(rows))


def test_every_difference_from_fla_is_documented_and_every_documented_one_is_real():
  found, table = differences(), documented()
  undocumented, stale = found - set(table), set(table) - found
  assert not undocumented, ("differences from fla 0.6.0 missing from DESIGN.md's table (add them with "
                            "their reason):\n" + markdown(undocumented))
  assert not stale, "rows of DESIGN.md's fla table that are no longer differences:\n" + markdown(stale)
  assert all(table.values()), [row for row, reason in table.items() if not reason]


OPS = [n for n in pallas_kernels.__all__ if "backend" in inspect.signature(getattr(pallas_kernels, n)).parameters]


@pytest.mark.parametrize("name", OPS)
def test_lineax_arguments_are_keyword_only_after_flas(name):
  params = list(inspect.signature(getattr(pallas_kernels, name)).parameters.values())
  extras = [p for p in params if p.name in EXTRAS]
  assert [(p.name, p.kind, p.default) for p in extras] == [
      (n, inspect.Parameter.KEYWORD_ONLY, d) for n, d in EXTRAS.items()]
  fla_names = {n for n, *_ in FLA.get(name, {"params": []})["params"]}
  assert all(params.index(extras[0]) > i for i, p in enumerate(params) if p.name in fla_names), (
      f"{name}: `{extras[0].name}` comes before one of fla's arguments")


def test_the_signature_data_is_fla_0_6_0():
  assert re.fullmatch(r"fla_core-0\.6\.0", json.loads(
      (pathlib.Path(__file__).parent / "data" / "fla_0_6_0_signatures.json").read_text())["source"])
