"""Load a trained model for inference, and save / load it in the Hugging Face layout.

  lm = lineax_lm.load("runs/x")                  # a training workdir (latest step) or a saved folder
  lm.generate(["The cat", "Once upon a time"], max_new_tokens=32)   # prompts of any lengths
  lineax_lm.save_pretrained(lm.model, "exported/x", tokenizer=lm.tokenizer)
  model = lineax_lm.from_pretrained("exported/x")                  # the HybridLM alone
  model = lineax_lm.from_pretrained("fla-hub/gla-340M-15B")        # an fla checkpoint folder

From a workdir only the parameters of the checkpoint are read (no optimizer state, no data
iterator), on a one-axis data mesh of the local devices. The Hugging Face layout is a folder with
`config.json` (the ModelConfig fields, `model_type` and the tokenizer) and `model.safetensors` (one
tensor per parameter, named by its path in the model: `blocks.0.mixer.q_proj.kernel`), plus the
run's `tokenizer.json` when it has one. Paths may be local or gs://... (etils.epath).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx, traverse_util

from lineax_lm import storage
from lineax_lm.models.generate import check_rng, generate_ragged
from lineax_lm.models.config import ModelConfig
from lineax_lm.models.hybrid import HybridLM, abstract_model
from lineax_lm.models.presets import model_config

log = logging.getLogger("lineax_lm")

MODEL_TYPE = "lineax_hybrid"
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
# The sha256 of the weights and tokenizer files, and the config fields the tensors were saved with.
CHECKSUMS_FILE = "lineax_checksums.json"
MODEL_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, CHECKSUMS_FILE)
# ModelConfig fields that change how a saved model runs or was initialised, not what it computes:
# config.json may be edited in these; any other edit makes it describe a different model.
RUNTIME_FIELDS = frozenset({"dtype", "param_dtype", "remat", "backend", "attn_impl", "scan_layers",
                            "keep_states", "max_segments", "init_std", "residual_init"})


@dataclasses.dataclass
class Pretrained:
  """A model ready for inference: the HybridLM, its tokenizer (None for a run on MQAR ids), the
  training config when it came from a workdir, and the step it was saved at."""
  model: HybridLM
  tokenizer: Any = None
  config: Any = None
  step: int | None = None

  def generate(self, prompts: str | Sequence[str], max_new_tokens: int = 64, *,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
               rng=None, batch_size: int = 32) -> str | list[str]:
    """Continuations of text prompts of any lengths (greedy by default). Each prompt is encoded
    after the bos token, as the training pipelines do; generation stops at eos. Prompts are sorted
    by length and run `batch_size` at a time (see models.generate.generate_ragged)."""
    if self.tokenizer is None:
      raise ValueError("this model has no text tokenizer (it trained on MQAR token ids): call "
                       "lineax_lm.generate_ragged(model, token_id_lists, ...) instead")
    single = isinstance(prompts, str)
    texts = _texts(prompts)
    ids = [[self.tokenizer.bos_id] + self.tokenizer.encode(t) for t in texts]
    new = generate_batches(self.model, ids, max_new_tokens, batch_size=batch_size,
                           eos_id=self.tokenizer.eos_id, temperature=temperature, top_k=top_k,
                           top_p=top_p, rng=rng)
    out = [self.tokenizer.decode([t for t in row if t != self.tokenizer.eos_id]) for row in new]
    return out[0] if single else out


def _texts(prompts) -> list[str]:
  """`prompts` (a string or a sequence of strings) as a list of strings."""
  must = "`prompts` must be a string or a sequence of strings"
  if prompts is None or isinstance(prompts, (bytes, bytearray)):
    hint = "" if prompts is None else " (decode it first: prompts.decode())"
    raise ValueError(f"{must}; got {type(prompts).__name__}{hint}")
  texts = [prompts] if isinstance(prompts, str) else list(prompts)
  others = sorted({type(t).__name__ for t in texts if not isinstance(t, str)})
  if others:
    raise ValueError(f"{must}; got a sequence holding {', '.join(others)}")
  return texts


def generate_batches(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                     batch_size: int = 32, progress: bool = False, **sampling) -> list[list[int]]:
  """generate_ragged over many prompts: sorted by length so that each batch holds neighbours (few
  prompt tokens fed one per step, few distinct compiled programs), the last batch padded to
  `batch_size` with copies of its first prompt (one batch shape), results in the input order.
  progress: a tqdm bar (tqdm.auto: a widget in notebooks) over the prompts."""
  if batch_size < 1:
    raise ValueError(f"`batch_size` must be >= 1; got {batch_size}")
  order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
  out: list = [None] * len(prompts)
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=len(prompts), desc="generate", unit="prompt")
  rng = sampling.pop("rng", None)
  check_rng(rng)
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    batch = [prompts[i] for i in idx]
    batch += [batch[0]] * (min(batch_size, len(order)) - len(batch))
    if rng is not None:
      rng, key = jax.random.split(rng)
    else:
      key = None
    new = generate_ragged(model, batch, max_new_tokens, rng=key, **sampling)
    for i, row in zip(idx, new):
      out[i] = row
    if bar is not None:
      bar.update(len(idx))
  if bar is not None:
    bar.close()
  return out


# ------------------------------------------------------------------------------ loading
def load(path, step: int | None = None) -> Pretrained:
  """A model for inference from a training workdir (`<path>/checkpoints`; `step`: latest when
  None), a folder written by `save_pretrained` (`<path>/config.json`) or an fla checkpoint folder
  (lineax_lm.convert.load_fla)."""
  from lineax_lm.convert import fla
  root = storage.as_path(path)
  if folder_kind(path) == "saved":
    if step is not None:
      raise ValueError(f"`step` applies to a training workdir; {path} is a saved model folder")
    return fla.load_fla(root) if fla.fla_model_type(root) else _load_saved(root)
  return load_run(path, step)


def folder_kind(path) -> str:
  """"saved" (`<path>/config.json`: save_pretrained's or fla's) or "run" (`<path>/checkpoints`), or a
  FileNotFoundError naming the path: what `load` reads, checked without reading it."""
  root = storage.as_path(path)
  if (root / CONFIG_FILE).exists():
    return "saved"
  if (root / "checkpoints").exists():
    return "run"
  raise FileNotFoundError(f"{path} holds neither {CONFIG_FILE} (a saved model) nor checkpoints/ "
                          "(a training workdir)")


def from_pretrained(path, step: int | None = None) -> HybridLM:
  """The HybridLM of `load(path, step)`."""
  return load(path, step).model


def load_run(workdir, step: int | None = None) -> Pretrained:
  """The parameters of a training run's checkpoint (`step`: the newest intact one when None) in a
  HybridLM, with the run's config and text tokenizer."""
  from lineax_lm import sharding
  from lineax_lm.data.pipeline import make_tokenizer
  from lineax_lm.train import checkpoint
  from lineax_lm.train.trainer import Trainer  # the trainer's state layout is the checkpoint's
  config = ml_collections.ConfigDict(checkpoint.restore_config(workdir, step))
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # any device count
  model_cfg = model_config(config.model)
  trainer = Trainer(config, model_cfg, sharding.make_mesh(config.mesh))
  target = {"params": trainer.abstract_state()["params"]}
  mngr = checkpoint.reader(workdir)
  try:
    state, step = checkpoint.restore(mngr, target, step=step, params_only=True)
  finally:
    mngr.close()
  model = nnx.merge(trainer.graphdef, state["params"])
  tokenizer = None if config.data.source == "mqar" else make_tokenizer(config.data)
  return Pretrained(model, tokenizer, config, int(step))


# ------------------------------------------------------------------------------ HF layout
def config_dict(model_cfg: ModelConfig) -> dict:
  """The ModelConfig fields as JSON values (tuples as lists, mixer_cfg as an object)."""
  d = dataclasses.asdict(model_cfg)
  d["mixer_cfg"] = dict(model_cfg.mixer_cfg)
  d["attn_layers"] = None if model_cfg.attn_layers is None else list(model_cfg.attn_layers)
  return d


def save_pretrained(model: HybridLM, path, tokenizer=None, format: str = "lineax", *,
                    overwrite: bool = False) -> str:
  """Writes `model` (and `tokenizer`: the byte tokenizer or one read from a tokenizer.json) to
  folder `path` in the Hugging Face layout, with the checksums `from_pretrained` verifies, or with
  format="fla" as flash-linear-attention's checkpoint (lineax_lm.convert.to_fla); returns the
  folder. A folder that holds files already is refused unless `overwrite`, which first removes the
  files of the model saved there (no stale tokenizer.json survives)."""
  from safetensors.flax import save as save_tensors
  import lineax_lm
  if format not in ("lineax", "fla"):
    raise ValueError(f"`format` must be 'lineax' or 'fla'; got {format!r}")
  root = storage.as_path(path)
  _prepare_folder(root, overwrite)
  if format == "fla":
    from lineax_lm.convert import fla
    return fla.to_fla(model, path, tokenizer)
  tensors = {".".join(map(str, key)): jnp.asarray(value)
             for key, value in _flat_params(model).items()}
  (root / WEIGHTS_FILE).write_bytes(save_tensors(tensors, metadata={"format": "flax"}))
  meta = {"model_type": MODEL_TYPE, "architectures": ["HybridLM"],
          "lineax_lm_version": lineax_lm.__version__, **config_dict(model.config)}
  if tokenizer is not None:
    meta["tokenizer"] = _save_tokenizer(tokenizer, root)
  (root / CONFIG_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
  _write_checksums(root, model.config)
  return str(root)


def _load_saved(root) -> Pretrained:
  meta = _read_config(root)
  names = {f.name for f in dataclasses.fields(ModelConfig)}
  try:
    model_cfg = ModelConfig(**{k: v for k, v in meta.items() if k in names})
  except (TypeError, ValueError) as e:
    raise ValueError(f"{root / CONFIG_FILE} does not describe a valid model: {e}") from None
  saved = _verify_checksums(root)
  tensors = _read_tensors(root)
  abstract = abstract_model(model_cfg)
  want = _flat_params(abstract)
  got = {tuple(_key_part(p) for p in name.split(".")): value for name, value in tensors.items()}
  missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
  if missing or extra:
    raise ValueError(f"{root / WEIGHTS_FILE} does not fit its config.json: missing "
                     f"{['.'.join(map(str, k)) for k in missing[:5]]}, unexpected "
                     f"{['.'.join(map(str, k)) for k in extra[:5]]}")
  for key, spec in want.items():
    if tuple(got[key].shape) != tuple(spec.shape):
      raise ValueError(f"{root / WEIGHTS_FILE}: {'.'.join(map(str, key))} has shape "
                       f"{tuple(got[key].shape)}, the config needs {tuple(spec.shape)}")
  if saved is not None:
    _check_saved_fields(root, model_cfg, saved)
  graphdef, state = nnx.split(abstract)
  nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(
      {k: jnp.asarray(got[k], want[k].dtype) for k in want}))
  model = nnx.merge(graphdef, state)
  return Pretrained(model, _load_tokenizer(meta.get("tokenizer"), root))


def _prepare_folder(root, overwrite: bool):
  """Creates folder `root`; one that holds files is refused unless `overwrite`, which removes the
  files of a model saved there (MODEL_FILES) and leaves any other."""
  present = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
  if present and not overwrite:
    shown = ", ".join(present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
    raise FileExistsError(f"{root} is not empty ({shown}); pass overwrite=True to replace the model "
                          "saved there, or choose an empty folder")
  for name in MODEL_FILES:
    if name in present:
      (root / name).unlink()
  root.mkdir(parents=True, exist_ok=True)


def _architecture(model_cfg: ModelConfig) -> dict:
  """The fields that define what the model computes, as JSON values."""
  fields = config_dict(model_cfg)
  return json.loads(json.dumps({k: v for k, v in fields.items() if k not in RUNTIME_FIELDS}))


def _write_checksums(root, model_cfg: ModelConfig):
  files = {name: list(storage.sha256(root / name)) for name in (WEIGHTS_FILE, TOKENIZER_FILE)
           if (root / name).exists()}
  record = {"algorithm": "sha256", "files": files, "model": _architecture(model_cfg)}
  (root / CHECKSUMS_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))


def _read_json(path, what: str):
  try:
    value = json.loads(path.read_text())
  except ValueError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} must hold a JSON object ({what}); it holds a {type(value).__name__}")
  return value


def _read_config(root) -> dict:
  meta = _read_json(root / CONFIG_FILE, "the model's config")
  if meta.get("model_type") != MODEL_TYPE:
    raise ValueError(f"{root / CONFIG_FILE} has model_type {meta.get('model_type')!r}, not "
                     f"{MODEL_TYPE!r}: not a lineax_lm model")
  return meta


def _verify_checksums(root) -> dict | None:
  """Checks the files against `CHECKSUMS_FILE` and returns it; None (with a warning) for a folder
  saved before checksums."""
  path = root / CHECKSUMS_FILE
  if not path.exists():
    log.warning("%s has no %s (saved before checksums): loading it unverified", root, CHECKSUMS_FILE)
    return None
  saved = _read_json(path, "sha256 checksums")
  for name, (size, digest) in sorted(saved.get("files", {}).items()):
    if not (root / name).exists():
      raise FileNotFoundError(f"{root / name} is missing ({path} lists it)")
    if storage.sha256(root / name) != (size, digest):
      raise ValueError(f"{root / name} does not match its sha256 in {CHECKSUMS_FILE}: the file "
                       "changed since save_pretrained wrote it (damaged or replaced); save the "
                       "model again")
  return saved


def _read_tensors(root) -> dict:
  from safetensors.flax import load as load_tensors
  try:
    return load_tensors((root / WEIGHTS_FILE).read_bytes())
  except Exception as e:  # safetensors raises its own error type for truncated or foreign files
    raise ValueError(f"{root / WEIGHTS_FILE} is not a readable safetensors file (truncated or "
                     f"damaged: {type(e).__name__}: {e})") from None


def _check_saved_fields(root, model_cfg: ModelConfig, saved: dict):
  """config.json's model fields against those the tensors were saved with: an edited head count or
  rope_theta keeps every shape and loads a different model."""
  was, now = saved.get("model", {}), _architecture(model_cfg)
  changed = [f"{k}={now.get(k)!r} (saved with {was[k]!r})" for k in sorted(was) if now.get(k) != was[k]]
  if changed:
    raise ValueError(f"{root / CONFIG_FILE} does not describe the tensors in {WEIGHTS_FILE}: "
                     f"{'; '.join(changed)}, as recorded in {CHECKSUMS_FILE}. Only "
                     f"{', '.join(sorted(RUNTIME_FIELDS))} may be edited")


def _flat_params(model) -> dict[tuple, Any]:
  """{path tuple: array} of the model's parameters (list indices as ints)."""
  return traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _key_part(part: str):
  return int(part) if part.isdigit() else part


def _save_tokenizer(tokenizer, root) -> dict:
  from lineax_lm.data.tokenizer import ByteTokenizer
  ids = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
  if isinstance(tokenizer, ByteTokenizer):
    return {"kind": "byte", **ids}
  source = getattr(tokenizer, "path", None)
  if source is None:
    raise ValueError(f"cannot save tokenizer {tokenizer!r}: only the byte tokenizer and tokenizers "
                     "read from a tokenizer.json can be saved")
  (root / TOKENIZER_FILE).write_bytes(storage.as_path(source).read_bytes())
  hf = tokenizer.hf
  return {"kind": "tokenizer.json", **ids, "bos_token": hf.id_to_token(tokenizer.bos_id),
          "eos_token": hf.id_to_token(tokenizer.eos_id), "pad_token": hf.id_to_token(tokenizer.pad_id)}


def _load_tokenizer(meta, root):
  from lineax_lm.data.tokenizer import ByteTokenizer, HFTokenizer
  if not meta:
    return None
  if meta["kind"] == "byte":
    return ByteTokenizer()
  local = root / TOKENIZER_FILE
  if storage.is_remote(local):  # tokenizers reads local files only
    import tempfile
    folder = tempfile.mkdtemp(prefix="lineax_tokenizer_")
    local_path = f"{folder}/{TOKENIZER_FILE}"
    with open(local_path, "wb") as f:
      f.write(local.read_bytes())
    local = local_path
  return HFTokenizer(str(local), bos_token=meta.get("bos_token"), eos_token=meta.get("eos_token"),
                     pad_token=meta.get("pad_token"))
