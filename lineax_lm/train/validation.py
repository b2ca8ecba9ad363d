"""Range checks of a training config's numeric fields, run before anything compiles.

A value out of range fails late and far from its cause: `log_every=0` or `grad_accum=0` as a
ZeroDivisionError after the step compiled, `num_layers=0` as a KeyError, and `lr=-1e-3` or
`steps=-5` not at all. `RULES` is one table of (field, allowed range) over the whole config tree;
`check_config(config)` applies every rule whose field the config has (configs differ: one written
by an older version may lack a field) and raises one ValueError that lists every field out of range
with its value and the range allowed, every string field not among its `CHOICES`, and every broken
relation between fields. `check_model_config` applies the model's part to a ModelConfig.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax.numpy as jnp

from lineax_lm.models.config import ModelConfig
from pallas_kernels.common import dispatch


@dataclasses.dataclass(frozen=True)
class Range:
  """An interval of numbers [low, high] (each end open or closed), for integers only or any real;
  `none` also allows None (an optional field), `special` a few values outside it, each with what
  it means (-1: "all remaining devices")."""
  low: float = -math.inf
  high: float = math.inf
  low_open: bool = False
  high_open: bool = False
  integer: bool = True
  none: bool = False
  special: tuple[tuple[Any, str], ...] = ()

  def allows(self, value) -> bool:
    if value is None:
      return self.none
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      return False
    if any(value == v for v, _ in self.special):
      return True
    if self.integer and not isinstance(value, numbers.Integral):
      return False
    above = value > self.low if self.low_open else value >= self.low
    below = value < self.high if self.high_open else value <= self.high
    return bool(above and below and math.isfinite(value))

  def describe(self) -> str:
    kind = "an integer" if self.integer else "a number"
    if math.isinf(self.high):
      text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
    else:
      text = (f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
              f"{')' if self.high_open else ']'}")
    text += "".join(f", or {v!r} ({meaning})" for v, meaning in self.special)
    return text + (", or None" if self.none else "")


def count(low: int = 1, none: bool = False, special=()) -> Range:
  """An integer >= low."""
  return Range(low=low, none=none, special=special)


def positive() -> Range:
  """A real number > 0."""
  return Range(low=0, low_open=True, integer=False)


def at_least(low: float) -> Range:
  """A real number >= low."""
  return Range(low=low, integer=False)


def fraction(high_open: bool = False) -> Range:
  """A real number in [0, 1] (or [0, 1))."""
  return Range(low=0, high=1, high_open=high_open, integer=False)


AXIS = count(1, special=((-1, "all remaining devices"),))

# (dotted field, allowed range): every numeric field of lineax_lm.train.config.base_config() and
# of ModelConfig (a test keeps this table complete). Mixer options (model.mixer_cfg) differ per
# mixer and are not checked here.
RULES: tuple[tuple[str, Range], ...] = (
    ("seed", count(0)),
    ("model.vocab_size", count(1)),
    ("model.num_layers", count(1)),
    ("model.hidden", count(1)),
    ("model.heads", count(1)),
    ("model.kv_heads", count(1, none=True)),
    ("model.head_dim", count(1, none=True)),
    ("model.mlp_hidden", count(1, none=True)),
    ("model.linear_mlp_hidden", count(1, none=True)),
    ("model.window", count(1, none=True)),
    ("model.rope_theta", positive()),
    ("model.norm_eps", positive()),
    ("model.init_std", positive()),
    ("model.max_segments", count(1)),
    ("data.seq_len", count(1)),
    ("data.global_batch_size", count(1)),
    ("data.num_epochs", count(1, none=True)),
    ("data.num_threads", count(0)),
    ("data.prefetch_buffer_size", count(0)),
    ("data.num_packing_bins", count(1)),
    ("data.heldout_fraction", fraction(high_open=True)),
    ("data.max_segments", count(1, none=True)),
    ("data.mqar.vocab_size", count(1)),
    ("data.mqar.num_kv_pairs", count(1)),
    ("data.mqar.power_a", positive()),
    ("data.mqar.num_examples", count(1)),
    ("data.recall_mix.fraction", fraction(high_open=True)),        # 0: no synthetic rows
    ("data.recall_mix.mqar_kv_pairs", count(1)),
    ("data.recall_mix.mqar_loss_weight", count(1)),
    ("train.steps", count(1)),
    ("train.tokens", count(0)),                                     # 0: train.steps as given
    ("train.grad_accum", count(1)),
    ("train.lr", positive()),
    ("train.min_lr_ratio", fraction()),
    ("train.warmup_steps", count(0)),
    ("train.b1", fraction(high_open=True)),
    ("train.b2", fraction(high_open=True)),
    ("train.eps", positive()),
    ("train.weight_decay", at_least(0)),
    ("train.clip_norm", Range(low=0, integer=False, none=True)),   # 0 or None: no clipping
    ("train.loss_chunk", count(0)),                                 # 0: plain logits
    ("train.log_every", count(1)),
    ("train.checkpoint_every", count(1)),
    ("train.keep_checkpoints", count(1, special=((0, "keep every step"),))),
    ("train.restore_step", count(0, special=((-1, "the latest checkpoint"),))),
    ("train.profile_steps", count(0)),
    ("train.profile_start", count(0)),
    ("eval.every", count(1)),
    ("eval.steps", count(0)),
    ("eval.seed", count(0)),
    ("mesh.data", AXIS),
    ("mesh.fsdp", AXIS),
    ("mesh.context", AXIS),
    ("mesh.tensor", AXIS),
)


def _float_dtype(value) -> bool:
  try:
    return jnp.issubdtype(jnp.dtype(value), jnp.floating)
  except TypeError:
    return False


def _sources() -> tuple[str, ...]:
  """The data sources, imported when a config's data section is checked: the pipeline imports
  grain, which a ModelConfig (checked here too) has no need of."""
  from lineax_lm.data.pipeline import SOURCES
  return SOURCES


# (dotted field, test, what is allowed): the string fields whose wrong value would otherwise fail
# far from its cause (a data source blamed on the vocabulary, a dtype or a kernel platform failing
# inside the model's construction or after compiling). None (a preset's placeholder) is allowed.
CHOICES: tuple[tuple[str, Any, Any], ...] = (
    ("data.source", lambda v: v in _sources(), lambda: f"one of {', '.join(_sources())}"),
    ("model.dtype", _float_dtype, "a floating-point dtype name: float32, bfloat16 or float16"),
    ("model.param_dtype", _float_dtype, "a floating-point dtype name: float32, bfloat16 or float16"),
    ("model.backend", lambda v: v in dispatch.BACKENDS, f"one of {', '.join(dispatch.BACKENDS)}"),
    ("model.attn_impl", lambda v: v in ("xla", "cudnn", "splash"), "one of xla, cudnn, splash"),
)


def choice_errors(config, choices=CHOICES, prefix: str = "config.") -> list[str]:
  """One line per field of `config` whose value is not among its `choices`."""
  errors = []
  for field, allowed, what in choices:
    present, value = _lookup(config, field)
    if present and value is not None and not allowed(value):
      errors.append(f"{prefix}{field}={value!r}: must be {what() if callable(what) else what}")
  return errors


def platform_errors(config) -> list[str]:
  """An explicit Pallas backend or attention kernel of another platform than this host's (it fails
  after compiling, or runs in interpret mode)."""
  _, backend = _lookup(config, "model.backend")
  _, attn_impl = _lookup(config, "model.attn_impl")
  errors = []
  if backend in dispatch.PALLAS_BACKENDS and dispatch.platform() != backend:
    errors.append(f"config.model.backend={backend!r}: this host runs jax on {dispatch.platform()}, "
                  f"where the Pallas {backend} kernels cannot run; use 'auto' (this platform's "
                  "kernels, else xla) or 'xla'")
  if attn_impl == "splash" and dispatch.platform() != "tpu":
    errors.append(f"config.model.attn_impl='splash': a TPU kernel, and this host runs jax on "
                  f"{dispatch.platform()}; leave it unset (a TPU takes splash by itself)")
  return errors


def _lookup(config, field: str):
  """(True, value) of a dotted field of a ConfigDict / mapping tree, or (False, None) if absent."""
  node = config
  for name in field.split("."):
    if not hasattr(node, "keys") or name not in node.keys():
      return False, None
    node = node[name]
  return True, node


def range_errors(config, rules=RULES, prefix: str = "config.") -> list[str]:
  """One line per field of `config` outside its range in `rules` (fields it lacks are skipped),
  each naming the field as `prefix` + its dotted name."""
  errors = []
  for field, allowed in rules:
    present, value = _lookup(config, field)
    if present and not allowed.allows(value):
      errors.append(f"{prefix}{field}={value!r}: must be {allowed.describe()}")
  return errors


MODEL_RULES = tuple((field.removeprefix("model."), allowed) for field, allowed in RULES
                    if field.startswith("model."))
MODEL_CHOICES = tuple((field.removeprefix("model."), *rest) for field, *rest in CHOICES
                      if field.startswith("model."))


def check_model_config(model_cfg) -> None:
  """ValueError listing every field of a ModelConfig out of its range in RULES or not among its
  CHOICES (the tables the command line's config goes through), and a head count that does not divide `hidden` when the
  attention layers take their head size from it."""
  fields = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg)}
  errors = (range_errors(fields, MODEL_RULES, prefix="ModelConfig.")
            + choice_errors(fields, MODEL_CHOICES, prefix="ModelConfig."))
  heads, hidden = fields["heads"], fields["hidden"]
  if (not errors and fields["head_dim"] is None and hidden % heads
      and model_cfg.attention_indices):
    errors.append(f"ModelConfig.heads={heads} does not divide hidden={hidden}: the attention "
                  f"layers' head size hidden // heads = {hidden // heads} would use "
                  f"{heads * (hidden // heads)} of the {hidden} channels; set head_dim, or a "
                  "head count that divides hidden")
  if errors:
    raise ValueError("invalid model config:\n  " + "\n  ".join(errors))


def relation_errors(config) -> list[str]:
  """Checks that span fields: the data's packing bound must fit the model's, the warmup the run."""
  errors = []
  has_data, data_bound = _lookup(config, "data.max_segments")
  _, model_bound = _lookup(config, "model.max_segments")
  model_bound = ModelConfig.max_segments if model_bound is None else model_bound
  _, source = _lookup(config, "data.source")
  _, packing = _lookup(config, "data.packing")
  if (has_data and data_bound is not None and source != "mqar" and packing != "none"
      and isinstance(data_bound, numbers.Integral) and isinstance(model_bound, numbers.Integral)
      and data_bound > model_bound):
    errors.append(f"config.data.max_segments={data_bound}: must be <= config.model.max_segments="
                  f"{model_bound}, the sequences the model holds per packed row (more turn the "
                  "loss into NaN)")
  _, warmup = _lookup(config, "train.warmup_steps")
  _, steps = _lookup(config, "train.steps")
  if (isinstance(warmup, numbers.Integral) and isinstance(steps, numbers.Integral)
      and warmup > steps):
    errors.append(f"config.train.warmup_steps={warmup}: must be <= config.train.steps={steps} "
                  f"(the run would end at {steps / warmup:.0%} of the warmup, never near "
                  "config.train.lr)")
  return errors


def check_config(config) -> None:
  """ValueError listing every numeric field of `config` out of its range (see RULES), every string
  field not among its CHOICES, a Pallas backend this host cannot run and every broken relation
  between fields, each with the field, its value and what is allowed."""
  errors = (range_errors(config) + choice_errors(config) + platform_errors(config)
            + relation_errors(config))
  if errors:
    raise ValueError("invalid config:\n  " + "\n  ".join(errors))
