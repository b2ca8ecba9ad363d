"""Every module, function and file that a current doc names as code exists.

The docs (README.md, docs/*.md, the package READMEs, benchmarks/RESULTS.md; not docs/history/,
which is an archive) name code in backticks. A renamed function or moved file leaves such a name
pointing at nothing, and nothing else would notice. Checked, in inline code spans outside fenced
blocks:
- dotted paths into the repo: `lineax_lm.x.y`, `pallas_kernels.x.y` (also inside a command such as
  `python -m lineax_lm.eval`), and `module.attr` forms whose first part is a module of the doc's
  own package, of `pallas_kernels.common` or of a top package (`common.gpu.layout.run_chunked`,
  `models.hybrid.init_params`, `gpu.unsupported` in a family README); each must import and getattr;
- repo file paths (`configs/x.py`, `launch/x.sh`, `results/...`, `common/gpu/chunk_o.py` in a
  package README), relative to the repo root, the doc's folder or the doc's top package; each must
  exist. Placeholders (`configs/X.py`, `<mixer>`, `*`) are not paths, and paths into the folders
  `.gitignore` names at the root (`runs/...`, what a command writes) are outputs, not code: they
  exist after `make demo` and not before, and the check must pass either way.
Names whose first part is no repo module (`jax.nn.dot_product_attention`, `Block._mlp`) and
config key paths (`data.seq_len`, `config.train.lr`) are not checked: the test must raise no false
alarms.
"""

import functools
import glob
import importlib
import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_PACKAGES = ("lineax_lm", "pallas_kernels")

IDENT = r"[A-Za-z_]\w*"
DOTTED = re.compile(rf"^{IDENT}(?:\.{IDENT})+(?:\(.*\))?$")
TOP_DOTTED = re.compile(rf"^(?:{'|'.join(TOP_PACKAGES)})(?:\.{IDENT})+")
FILE_SUFFIX = re.compile(r"\.(?:py|md|sh|json|jsonl|txt|tgz|gz|png|yaml|toml|ipynb|gguf|csv|log)$")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|(?:^|/)[A-Z]+(?:[./]|$)")


def doc_files():
  paths = ["README.md", "benchmarks/RESULTS.md", *glob.glob("docs/*.md", root_dir=ROOT)]
  for package in TOP_PACKAGES:
    paths += glob.glob(f"{package}/**/README.md", root_dir=ROOT, recursive=True)
  return sorted(p for p in paths if os.path.exists(os.path.join(ROOT, p)))


def code_spans(text):
  """Inline code spans outside fenced blocks."""
  text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
  return re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)


def module_bases(doc):
  """Packages a `module.attr` name in `doc` may be relative to, most specific first."""
  parts = os.path.dirname(doc).split("/") if os.path.dirname(doc) else []
  bases = [".".join(parts[:i]) for i in range(len(parts), 0, -1) if parts[0] in TOP_PACKAGES]
  return [*bases, "pallas_kernels.common", *TOP_PACKAGES]


@functools.cache
def is_module(name):
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def resolves(dotted):
  """Import the longest module prefix of `dotted`, then getattr the rest."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    name = ".".join(parts[:i])
    if is_module(name):
      obj = importlib.import_module(name)
      try:
        for attr in parts[i:]:
          obj = getattr(obj, attr)
      except AttributeError:
        return False
      return True
  return False


@functools.cache
def config_dicts():
  from lineax_lm.distill.config import distill_config
  from lineax_lm.train.config import base_config
  return base_config(), distill_config()


def is_config_key(dotted):
  """Whether `dotted` (a leading `config.` aside) is a key path of the train or distill config:
  `data.seq_len` there names a setting, not lineax_lm.data's attribute."""
  keys = dotted.removeprefix("config.").split(".")
  for config in config_dicts():
    node = config
    for key in keys:
      if not hasattr(node, "keys") or key not in node.keys():
        break
      node = node[key]
    else:
      return True
  return False


def symbol_problems(doc, span):
  """Names in one code span that point at nothing."""
  problems = []
  tokens = span.split()
  for token in tokens:
    match = TOP_DOTTED.match(token)
    if match and not resolves(match.group(0)):
      problems.append(match.group(0))
  if (len(tokens) == 1 and DOTTED.match(span) and not TOP_DOTTED.match(span)
      and not FILE_SUFFIX.search(span)):
    dotted = span.split("(")[0]
    first = dotted.split(".")[0]
    bases = [b for b in module_bases(doc) if is_module(f"{b}.{first}")]
    if bases and not is_config_key(dotted) and not any(resolves(f"{b}.{dotted}") for b in bases):
      problems.append(dotted)
  return problems


@functools.cache
def output_folders():
  """Top-level folders the repository's .gitignore names (`/runs/`): command outputs."""
  with open(os.path.join(ROOT, ".gitignore")) as f:
    return frozenset(m.group(1) for m in re.finditer(r"^/([^/*\s]+)/\s*$", f.read(), re.M))


def path_problems(doc, span):
  """Repo file paths in one code span that do not exist."""
  problems = []
  doc_dir = os.path.dirname(doc)
  roots = [ROOT, os.path.join(ROOT, doc_dir)]
  if doc_dir.split("/")[0] in TOP_PACKAGES:
    roots.append(os.path.join(ROOT, doc_dir.split("/")[0]))
  for token in span.split():
    path = token.split(":")[0].split("[")[0].rstrip(".,;)")
    if "/" not in path or path.startswith(("/", "./", "../")) or "://" in token:
      continue
    if PLACEHOLDER.search(path) or "=" in path:
      continue
    first = path.split("/")[0]
    if first in output_folders():
      continue
    candidates = [r for r in roots if os.path.isdir(os.path.join(r, first))]
    if candidates and not any(os.path.exists(os.path.join(r, path)) for r in candidates):
      problems.append(path)
  return problems


@pytest.mark.parametrize("doc", doc_files())
def test_code_names_in_docs_exist(doc):
  with open(os.path.join(ROOT, doc)) as f:
    spans = code_spans(f.read())
  missing = sorted({p for s in spans for p in symbol_problems(doc, s) + path_problems(doc, s)})
  assert not missing, f"{doc} names code that does not exist: {missing}"


def test_the_check_sees_the_forms_it_is_for():
  assert code_spans("a `x.y` b\n```\n`inside.fence`\n```\n`c/d.py:e`") == ["x.y", "c/d.py:e"]
  assert symbol_problems("README.md", "pallas_kernels.common.dispatch.support_table") == []
  assert symbol_problems("README.md", "python -m lineax_lm.no_such_module") == [
      "lineax_lm.no_such_module"]
  assert symbol_problems("pallas_kernels/kda/README.md", "gpu.no_such_function()") == [
      "gpu.no_such_function"]
  assert symbol_problems("README.md", "jax.nn.dot_product_attention") == []
  assert symbol_problems("docs/hybrid_study.md", "data.seq_len") == []
  assert path_problems("README.md", "configs/quickstart.py:gdn") == []
  assert path_problems("README.md", "configs/no_such_config.py") == ["configs/no_such_config.py"]
  assert path_problems("README.md", "configs/X.py") == []
  assert path_problems("README.md", "runs/not_yet_written/results.md") == []  # an output
