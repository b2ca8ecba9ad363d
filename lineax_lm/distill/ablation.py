"""Why the DeltaNet student trails: stage 1 (the "layer" objective) on a few teacher layers, for
students that differ in one piece each.

    python -m lineax_lm.distill.ablation                 # SmolLM2-135M-Instruct, layers 0, 10, 20
    python -m lineax_lm.distill.ablation --runlocal      # the tiny random teacher, seconds

For each layer i of --layers the teacher's own normalised inputs x_i = attn_norm(h_i) and its
attention outputs y_i are computed once on rows of the shipped teacher samples
(corpora/smollm2_samples: the study's training data); then each variant's mixer, initialised from
the teacher as the study's students are (lineax_lm.distill.student.init_student), is trained alone
on || mixer(x_i) - y_i ||^2 / mean(y_i^2) (stage 1's relative loss) with stage 1's optimizer, lr,
warmup and steps at the study's default budget. The table gives each variant's loss on held-out
rows before and after training (1 = a mixer that outputs zeros).

The variants cross the two pieces in which the DeltaNet and Gated DeltaNet students differ, the
decay of the state and the output gate:

  | variant                  | decay g_t                      | output                          |
  |--------------------------|--------------------------------|---------------------------------|
  | deltanet                 | none                           | RMSNorm(o) (fla's default)      |
  | deltanet_gate            | none                           | RMSNorm(o) * swish(g_proj(x))   |
  | gated_deltanet_no_decay  | none (A_log = -inf, frozen)    | RMSNorm(o) * swish(g_proj(x))   |
  | gated_deltanet_no_gate   | -exp(A_log) softplus(a_proj x) | RMSNorm(o)                      |
  | gated_deltanet           | -exp(A_log) softplus(a_proj x) | RMSNorm(o) * swish(g_proj(x))   |
  | linear_attn              | none (no delta rule, no conv)  | RMSNorm(o)                      |

The ungated RMSNorm's weight starts at 1 (fla's init, `init_student(output_norm_init="ones")`, as the
study's students started); `deltanet_zero_norm` and `linear_attn_zero_norm` start it at 0
(`output_norm_init="zeros"`, init_student's default).

Everything else is the same in the four delta-rule variants: q/k/v/o from the teacher, identity
short convolutions with SiLU, L2-normalised q and k, beta = sigmoid(b_proj(x)). With A_log = -inf
the decay exp(g) is exactly 1 and Gated DeltaNet computes exactly DeltaNet with the output gate
(`deltanet_gate`); the two rows differ only in the random draws of b_proj and g_proj.
"""
from __future__ import annotations

import functools
import gzip
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import flags
from flax import nnx
from tqdm import tqdm

from lineax_lm import cli
from lineax_lm.distill import data as distill_data, losses
from lineax_lm.distill.checkpoints import load_teacher, smollm2_gguf_path
from lineax_lm.distill.student import init_student, student_config
from lineax_lm.distill.study import study_config
from lineax_lm.distill.teacher import teacher_from_checkpoint, tiny_teacher
from lineax_lm.models.compile import call_shared
from lineax_lm.train.optim import make_optimizer

# variant -> (mixer, mixer_cfg overrides, decay switched off, output norm's weight started at 0)
VARIANTS = {
    "deltanet": ("deltanet", {}, False, False),
    "deltanet_gate": ("deltanet", {"use_gate": True}, False, False),
    "gated_deltanet_no_decay": ("gated_deltanet", {}, True, False),
    "gated_deltanet_no_gate": ("gated_deltanet", {"use_gate": False}, False, False),
    "gated_deltanet": ("gated_deltanet", {}, False, False),
    "linear_attn": ("linear_attn", {}, False, False),
    "deltanet_zero_norm": ("deltanet", {}, False, True),
    "linear_attn_zero_norm": ("linear_attn", {}, False, True),
}
DECAY_PARAMS = ("A_log", "a_proj", "dt_bias")  # frozen when the decay is switched off
CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "corpora", "smollm2_samples")


def corpus_texts(folder: str, split: str) -> list[str]:
  """The texts of `<folder>/{split}*.jsonl.gz` (the shipped teacher samples' layout), in file order."""
  names = sorted(n for n in os.listdir(folder) if n.startswith(split) and n.endswith(".jsonl.gz"))
  if not names:
    raise FileNotFoundError(f"--corpus: {folder} has no {split}*.jsonl.gz files")
  texts = []
  for name in names:
    with gzip.open(os.path.join(folder, name), "rt", encoding="utf-8") as f:
      texts.extend(json.loads(line)["text"] for line in f)
  return texts


def token_rows(texts, encode, bos_id: int, n: int, seq_len: int) -> np.ndarray:
  """[n, seq_len] int32: each row the document separator and the first seq_len - 1 tokens of one
  document long enough to fill it, as a packed training row starts a document."""
  rows = []
  for text in texts:
    ids = encode(text)
    if len(ids) >= seq_len - 1:
      rows.append([bos_id, *ids[:seq_len - 1]])
    if len(rows) == n:
      return np.asarray(rows, np.int32)
  raise ValueError(f"--corpus: {len(rows)} documents of >= {seq_len - 1} tokens; {n} rows needed "
                   "(lower --train_rows / --eval_rows or --seq_len)")


def layer_io(teacher, rows: np.ndarray, layers, batch: int) -> dict:
  """{layer i: (x_i, y_i)} as float32 numpy [N, L, D]: the teacher's normalised input to attention
  layer i and that attention layer's output, on `rows`."""
  out = {i: ([], []) for i in layers}
  for start in range(0, len(rows), batch):
    chunk = {"inputs": jnp.asarray(rows[start:start + batch])}
    ctx, _ = losses.context(teacher, chunk)
    h = teacher.embed(chunk["inputs"])
    for i, block in enumerate(teacher.blocks[:max(layers) + 1]):
      if i in out:
        out[i][0].append(np.asarray(call_shared(_normed, block, h)))
      h, y = call_shared(losses._teacher_block, block, h, ctx)
      if i in out:
        out[i][1].append(np.asarray(y))
  return {i: (np.concatenate(x), np.concatenate(y)) for i, (x, y) in out.items()}


def _normed(block, h):
  return block.attn_norm(h)


def variant_mixers(teacher, teacher_cfg, variant: str, layers, seed: int):
  """{layer i: the variant's student mixer at layer i}, initialised from the teacher as the study's
  students are; with the decay off, A_log = -inf so that exp(g) = 1 exactly."""
  mixer, mixer_cfg, no_decay, zero_norm = VARIANTS[variant]
  student = init_student(teacher, student_config(teacher_cfg, mixer, mixer_cfg=mixer_cfg), seed=seed,
                         output_norm_init="zeros" if zero_norm else "ones")
  mixers = {i: student.blocks[i].mixer for i in layers}
  if no_decay:
    for m in mixers.values():
      m.A_log[...] = jnp.full_like(m.A_log[...], -jnp.inf)
  return mixers


def trainable(variant: str):
  """The nnx filter of the parameters a variant trains: the mixer's, less the decay's when off."""
  if not VARIANTS[variant][2]:
    return nnx.Param
  return nnx.All(nnx.Param, nnx.Not(nnx.Any(*(nnx.PathContains(n) for n in DECAY_PARAMS))))


def _relative_error_sums(graphdef, params, rest, x, y):
  """(sum over tokens of mean_D (mixer(x) - y)^2, sum over tokens of mean_D y^2)."""
  pred = nnx.merge(graphdef, params, rest)(x)[0].astype(jnp.float32)
  return (jnp.sum(jnp.mean(jnp.square(pred - y), -1)), jnp.sum(jnp.mean(jnp.square(y), -1)))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _train_step(graphdef, optimizer, params, rest, opt_state, x, y):
  def loss(params):  # stage 1's per-batch relative loss (losses._squared_error, relative=True)
    mask = jnp.ones(y.shape[:2], jnp.float32)
    pred = nnx.merge(graphdef, params, rest)(x)[0]
    return jnp.mean(losses._squared_error(pred, y, mask, relative=True))
  value, grads = jax.value_and_grad(loss)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, value


_eval_sums = jax.jit(_relative_error_sums, static_argnums=0)


def evaluate(graphdef, params, rest, x: np.ndarray, y: np.ndarray, batch: int) -> float:
  """The relative error over all of (x, y): sum of squared errors / sum of y's mean squares."""
  err = ms = 0.0
  for s in range(0, len(x), batch):
    e, m = _eval_sums(graphdef, params, rest, jnp.asarray(x[s:s + batch]), jnp.asarray(y[s:s + batch]))
    err, ms = err + float(e), ms + float(m)
  return err / ms


def train_mixer(mixer, variant: str, train_cfg, train, heldout, batch: int, seed: int, bar=None):
  """Trains `mixer` on train = (x, y) for train_cfg.steps steps of `batch` rows (stage 1's
  optimizer, rows drawn in a fixed shuffled order, reused when the steps need more); returns
  (held-out loss before, after)."""
  graphdef, params, rest = nnx.split(mixer, trainable(variant), ...)
  optimizer = make_optimizer(train_cfg)
  opt_state = optimizer.init(params)
  before = evaluate(graphdef, params, rest, *heldout, batch)
  x, y = train
  order = np.random.default_rng(seed).permutation(len(x))
  for step in range(train_cfg.steps):
    idx = np.take(order, np.arange(step * batch, (step + 1) * batch), mode="wrap")
    params, opt_state, _ = _train_step(graphdef, optimizer, params, rest, opt_state,
                                       jnp.asarray(x[idx]), jnp.asarray(y[idx]))
    if bar is not None:
      bar.update(1)
  return before, evaluate(graphdef, params, rest, *heldout, batch)


def stage1_train_config(steps: int | None):
  """The optimizer section of the study's stage 1 at its default budget (steps, lr, warmup), or
  with `steps` steps (warmup 10%)."""
  c = study_config("deltanet")
  layer = c.stages.layer
  t = ml_collections.ConfigDict(c.train.to_dict())
  steps = layer.steps if steps is None else steps
  warmup = layer.warmup_steps if steps == layer.steps else max(1, steps // 10)
  t.update(dict(steps=steps, lr=layer.lr, warmup_steps=warmup))
  return t


def run(teacher, teacher_cfg, train_rows: np.ndarray, eval_rows: np.ndarray, *, layers, variants,
        steps: int | None = None, batch: int = 4, seed: int = 0) -> dict:
  """{variant: {layer: (held-out loss before, after)}} (module docstring)."""
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    raise ValueError(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
  bad = [i for i in layers if not 0 <= i < teacher_cfg.num_layers]
  if bad:
    raise ValueError(f"--layers: {bad} outside the teacher's {teacher_cfg.num_layers} layers")
  train_cfg = stage1_train_config(steps)
  train = layer_io(teacher, train_rows, layers, batch)
  heldout = layer_io(teacher, eval_rows, layers, batch)
  results = {}
  with tqdm(total=len(variants) * len(layers) * train_cfg.steps, unit="step", desc="stage 1",
            dynamic_ncols=True) as bar:
    for variant in variants:
      mixers = variant_mixers(teacher, teacher_cfg, variant, layers, seed)
      results[variant] = {}
      for i in layers:
        bar.set_postfix_str(f"{variant} layer {i}")
        before, after = results[variant][i] = train_mixer(mixers[i], variant, train_cfg, train[i],
                                                          heldout[i], batch, seed, bar)
        bar.write(f"{variant} layer {i}: held-out loss {before:.3f} -> {after:.3f}")
  return results


def table(results: dict) -> str:
  """A markdown table: one row per variant, held-out loss before -> after per layer, mean after."""
  layers = list(next(iter(results.values())))
  head = ["variant", *(f"layer {i}: init -> trained" for i in layers), "mean trained"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for variant, per_layer in results.items():
    cells = [f"{b:.3f} -> {a:.3f}" for b, a in per_layer.values()]
    mean = np.mean([a for _, a in per_layer.values()])
    lines.append(f"| {variant} | " + " | ".join(cells) + f" | {mean:.3f} |")
  return "\n".join(lines)


def define_flags(fv: flags.FlagValues, argv) -> None:
  del argv
  flags.DEFINE_string("teacher", "", "GGUF file or HF directory ('' = the shipped SmolLM2)",
                      flag_values=fv)
  flags.DEFINE_bool("runlocal", False, "the tiny random teacher on the corpus' bytes (seconds)",
                    flag_values=fv)
  flags.DEFINE_string("corpus", CORPUS, "folder of train*.jsonl.gz / heldout*.jsonl.gz teacher "
                      "samples", flag_values=fv)
  flags.DEFINE_list("layers", ["0", "10", "20"], "teacher layers to align", flag_values=fv)
  flags.DEFINE_list("variants", list(VARIANTS), "variants (module docstring)", flag_values=fv)
  flags.DEFINE_integer("steps", None, "training steps per mixer (default: stage 1's at the "
                       "study's default budget)", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("batch", 4, "rows per step (the study's)", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("seq_len", 512, "tokens per row", lower_bound=8, flag_values=fv)
  flags.DEFINE_integer("train_rows", 48, "training rows (reused when the steps need more)",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("eval_rows", 8, "held-out rows the losses are measured on", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_integer("seed", 0, "student init and row order", flag_values=fv)
  flags.DEFINE_string("out", "", "also write the results here as JSON", flag_values=fv)


def main(argv=None) -> dict:
  fv = cli.parse(define_flags, argv, "python -m lineax_lm.distill.ablation", __doc__)
  try:
    layers = [int(i) for i in fv.layers]
  except ValueError:
    cli.fail(f"--layers: {fv.layers} are not layer indices")
  if fv.runlocal:
    ckpt, bos_id = tiny_teacher(seed=fv.seed), 256
    encode = lambda text: list(text.encode("utf-8"))  # the byte tokenizer's ids
  else:
    ckpt = load_teacher(fv.teacher or smollm2_gguf_path())
    hf = ckpt.tokenizer.hf  # rows start with the document separator, as the study's packing does
    bos_id = next((hf.token_to_id(t) for t in distill_data.SEPARATORS if hf.token_to_id(t) is not None),
                  ckpt.tokenizer.eos_id)
    encode = lambda text: ckpt.tokenizer.encode(text, add_special_tokens=False)
  # runlocal: the plain recurrences, which compile fastest at a few dozen tokens
  teacher, teacher_cfg = teacher_from_checkpoint(ckpt, **({"backend": "reference"} if fv.runlocal else {}))
  train_rows = token_rows(corpus_texts(fv.corpus, "train"), encode, bos_id, fv.train_rows,
                          fv.seq_len)
  eval_rows = token_rows(corpus_texts(fv.corpus, "heldout"), encode, bos_id, fv.eval_rows,
                         fv.seq_len)
  try:
    results = run(teacher, teacher_cfg, train_rows, eval_rows, layers=layers,
                  variants=fv.variants, steps=fv.steps, batch=fv.batch, seed=fv.seed)
  except ValueError as e:
    cli.fail(e)
  print(table(results))
  if fv.out:
    with open(fv.out, "w", encoding="utf-8") as f:
      json.dump({v: {str(i): list(r) for i, r in per.items()} for v, per in results.items()}, f,
                indent=1)
  return results


if __name__ == "__main__":
  main()
