"""lm-evaluation-harness adapter: `--model lineax --model_args path=DIR --tasks ...` (see Registration).

Registration: importing this module registers the class with lm-eval's registry
(`lm_eval.api.registry.register_model("lineax")`, after lm-eval's own models are in it). lm-eval 0.4.x
does not read the `lm_eval.models` entry point the pyproject also declares, so run lm-eval's command
line through lineax_lm.eval.lm_eval, which imports this module first:
    python -m lineax_lm.eval.lm_eval --model lineax --model_args path=DIR --tasks lambada_openai
(`python -m lineax_lm.eval.lm_eval_adapter ...` runs the same), or
from Python: `import lineax_lm.eval.lm_eval_adapter; lm_eval.simple_evaluate(model="lineax", ...)`;
`evaluate_models({"teacher": t, "student": s}, tokenizer, "arc_easy,piqa")` scores in-memory models
on the same tasks (lineax_lm.distill's evaluation uses it for teacher and student alike).

model_args: path (required; `workdir` is the same), step (default: latest), tokenizer ("byte" or a tokenizer.json;
default: the run's data tokenizer), max_length (default: the run's data.seq_len), batch_size,
max_gen_toks (default 256). `workdir` may also be a `save_pretrained` folder. lm-eval is an optional extra (`pip install lineax-lm[eval]`); without it
the class still works on any objects carrying `.args` (the tests use that), with `object` as base.

Requests (lm-eval's `Instance.args`):
  loglikelihood          (context, continuation) -> (log p(continuation | context), is greedy)
  loglikelihood_rolling  (text,) -> log p(text | bos), rolling windows of max_length tokens
  generate_until         (context, {"until": [...], "max_gen_toks": n, ...}) -> greedy text, cut at
                         the first stop string (sampling arguments are ignored: greedy only);
                         prompts of any lengths batch together (models.generate.generate_ragged),
                         with a progress bar (tqdm.auto) unless lm-eval passes disable_tqdm
"""
from __future__ import annotations

from collections import defaultdict

from lineax_lm.eval.scoring import Scorer, cut_at_stop, loglikelihood_rolling, score_pairs
from lineax_lm.models.pretrained import generate_batches

try:
  from lm_eval.api.model import LM as _Base
  from lm_eval.api.registry import register_model as _register
except ImportError:  # lm-eval is an optional extra
  _Base, _register = object, None
else:
  try:  # lm-eval fills its registry with its own models only while the registry is empty
    import lm_eval.models  # noqa: F401
  except ImportError:  # a model module of lm-eval that needs what is not installed
    pass


class LineaxLM(_Base):
  """A lineax_lm checkpoint (or an in-memory model + tokenizer) as an lm-eval language model."""

  def __init__(self, workdir: str | None = None, step: int | None = None, tokenizer=None,
               max_length: int | None = None, batch_size: int | str = 8, max_gen_toks: int = 256,
               model=None, path: str | None = None, **unused):
    super().__init__()
    self._rank, self._world_size = getattr(self, "_rank", 0), getattr(self, "_world_size", 1)
    if path is not None and workdir is not None and path != workdir:
      raise ValueError(f"LineaxLM: `path`={path!r} and `workdir`={workdir!r} name two models; give one")
    workdir = workdir if path is None else path
    if model is None:
      if workdir is None:
        raise ValueError("LineaxLM needs `path` (a training run or save_pretrained folder; "
                         "`workdir` is the same) or `model`")
      from lineax_lm.models.pretrained import load
      loaded = load(workdir, None if step in (None, "", "latest") else int(step))
      model = loaded.model
      if loaded.config is not None:
        max_length = max_length or loaded.config.data.seq_len
      tokenizer = tokenizer or loaded.tokenizer
    if isinstance(tokenizer, str):
      from lineax_lm.data.tokenizer import load_tokenizer
      tokenizer = load_tokenizer(tokenizer)
    if tokenizer is None:
      raise ValueError("LineaxLM needs a text tokenizer: this run trained on MQAR; pass "
                       "tokenizer=byte or tokenizer=/path/to/tokenizer.json")
    self.model, self.tokenizer = model, tokenizer
    self._max_length = int(max_length or 2048)
    self.batch_size = 8 if str(batch_size).startswith("auto") else int(batch_size)
    self.max_gen_toks = int(max_gen_toks)
    self.scorer = Scorer(model, self.batch_size)

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
    """"k1=v1,k2=v2" (lm-eval's --model_args) plus lm-eval's batch_size / device settings."""
    extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
    return cls(**{**extra, **cls.parse_model_args(arg_string)})

  @staticmethod
  def parse_model_args(arg_string: str) -> dict:
    """"k1=v1,k2=v2" -> {k1: v1, k2: v2}, the integer arguments as ints."""
    args = {}
    for item in filter(None, (s.strip() for s in arg_string.split(","))):
      key, _, value = item.partition("=")
      args[key.strip()] = value.strip()
    for key in ("step", "max_length", "max_gen_toks"):
      if key in args:
        args[key] = int(args[key])
    return args

  # lm-eval's LM properties
  @property
  def eot_token_id(self) -> int:
    return self.tokenizer.eos_id

  @property
  def prefix_token_id(self) -> int:
    return self.tokenizer.bos_id

  @property
  def max_length(self) -> int:
    return self._max_length

  @property
  def rank(self) -> int:
    return self._rank

  @property
  def world_size(self) -> int:
    return self._world_size

  @property
  def tokenizer_name(self) -> str:
    return repr(self.tokenizer)

  def tok_encode(self, text: str) -> list[int]:
    return list(self.tokenizer.encode(text))

  def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation ids such that context + continuation tokenizes as one text (trailing
    spaces of the context move to the continuation, as lm-eval's TemplateLM does)."""
    if not context:
      return [self.prefix_token_id], self.tok_encode(continuation)
    n = len(context) - len(context.rstrip())
    if n:
      context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = self.tok_encode(context + continuation), self.tok_encode(context)
    return ctx, whole[len(ctx):]

  def _hook(self, kind: str, args, result):
    hook = getattr(self, "cache_hook", None)
    if hook is not None:
      hook.add_partial(kind, args, result)

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    pairs = [self._encode_pair(*req.args) for req in requests]
    results = score_pairs(self.scorer, pairs, self.max_length)
    for req, res in zip(requests, results):
      self._hook("loglikelihood", req.args, res)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    out = []
    for req in requests:
      ll = loglikelihood_rolling(self.scorer, self.tok_encode(req.args[0]), self.prefix_token_id,
                                 self.max_length)
      self._hook("loglikelihood_rolling", req.args, ll)
      out.append(ll)
    return out

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Greedy generation, `batch_size` prompts at a time whatever their lengths (sorted by length,
    one compiled program per length bucket and budget)."""
    jobs = defaultdict(list)
    for i, req in enumerate(requests):
      context, kwargs = req.args
      kwargs = dict(kwargs or {})
      until = kwargs.get("until") or []
      until = [until] if isinstance(until, str) else list(until)
      new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
      ids = self.tok_encode(context)[-max(1, self.max_length - new):] or [self.prefix_token_id]
      jobs[new].append((i, ids, until))
    out: list = [None] * len(requests)
    for new, group in jobs.items():
      generated = generate_batches(self.model, [ids for _, ids, _ in group], new,
                                   batch_size=self.batch_size, progress=not disable_tqdm,
                                   temperature=0.0, eos_id=self.eot_token_id)
      for (i, _, until), toks in zip(group, generated):
        if self.eot_token_id in toks:
          toks = toks[:toks.index(self.eot_token_id)]
        out[i] = cut_at_stop(self.tokenizer.decode(toks), until)
        self._hook("generate_until", requests[i].args, out[i])
    return out


if _register is not None:
  try:
    LineaxLM = _register("lineax")(LineaxLM)
  except ValueError:  # an lm-eval that already holds "lineax" (e.g. from the entry point) as a string
    pass


def evaluate_models(models: dict, tokenizer, tasks, *, limit: int | None = None,
                    include_path: str | None = None, max_length: int = 2048, batch_size: int = 8,
                    simple_evaluate=None) -> dict:
  """Scores several in-memory models on the same lm-eval tasks with the same settings (one
  `simple_evaluate` call per model through `LineaxLM`): {name: {task: {metric: value}}}, the
  numeric "metric,filter" entries only ("acc,none", "acc_stderr,none", ...). Checked with
  lm-eval 0.4 on a local multiple-choice task (a JSON-lines file and a task YAML in `include_path`).

  tasks: comma-separated names or a list; include_path: a folder of local task YAMLs (no download
  for tasks whose data is local); simple_evaluate: lm-eval's `simple_evaluate` by default (needs
  lm-eval installed), or any function with its (model, tasks, limit, task_manager) keywords."""
  tasks = [t.strip() for t in tasks.split(",") if t.strip()] if isinstance(tasks, str) else list(tasks)
  if not tasks:
    raise ValueError("tasks: name at least one lm-eval task")
  task_manager = None
  if simple_evaluate is None:
    try:
      from lm_eval import simple_evaluate
      from lm_eval.tasks import TaskManager
    except ImportError:
      raise ImportError("lm-eval tasks need lm-evaluation-harness: pip install lineax-lm[eval]") from None
    task_manager = TaskManager(include_path=include_path) if include_path else TaskManager()
  out = {}
  for name, model in models.items():
    lm = LineaxLM(model=model, tokenizer=tokenizer, max_length=max_length, batch_size=batch_size)
    results = simple_evaluate(model=lm, tasks=tasks, limit=limit, task_manager=task_manager)
    out[name] = {task: {m: float(v) for m, v in metrics.items()  # "metric,filter" keys only
                        if "," in m and isinstance(v, (int, float)) and not isinstance(v, bool)}
                 for task, metrics in results["results"].items()}
  return out


if __name__ == "__main__":
  from lineax_lm.eval.lm_eval import main
  main()
