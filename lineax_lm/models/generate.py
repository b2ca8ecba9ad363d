"""Generation with a cache: prefill with the chunk ops, then one token at a time with the
fused_recurrent ops inside one jit-compiled `lax.while_loop` (cache sizes: `models.cache`).

A batch's prompts are padded to `length_bucket` of the longest, and that whole width is prefilled
in one call whose prompt length (the shortest prompt's) is a traced value (HybridLM.step's
`length`): every batch of B rows whose longest prompt falls in one bucket runs one compiled program.
Equal-length prompts are prefilled whole; in a batch of different lengths, each longer row feeds
the rest of its prompt one token per decode step. The padding costs prefill work (fewer tokens
than the longest prompt has, from 16 tokens on), not a compiled program per length.

The cache (HybridLM.init_cache) is a pytree {"pos": int32, "layers": [...]}: each linear layer keeps
its float32 recurrent state and short-convolution inputs (constant size), each attention layer a KV
cache of max_len slots (2 * kv_heads * head_dim values per token).
"""
from __future__ import annotations

import functools
import math
import numbers
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def sample_logits(logits, rng, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None):
  """logits [B, V] float32 -> token ids [B] int32. Greedy when temperature == 0."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k is not None:
    kth = lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p is not None:
    desc = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(desc, axis=-1)
    # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff = jnp.min(jnp.where(before < top_p, desc, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def memory_limit() -> tuple[int, str]:
  """(bytes, what they are) of the memory one request may use: the first local device's limit on
  an accelerator, the host's physical memory on CPU (whose device reports none)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{jax.local_devices()[0].device_kind} memory"
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host memory"


def check_memory(needed: int, request: str):
  """ValueError when `needed` bytes exceed `memory_limit()`: a request that cannot fit is refused
  before it compiles, rather than running out of memory after working for a while."""
  limit, what = memory_limit()
  if needed > limit:
    raise ValueError(f"{request} needs {needed / 2**30:.1f} GiB, more than the {limit / 2**30:.1f} "
                     f"GiB of {what}")


def _check_request(model, rows: int, width: int, max_new_tokens: int):
  """Refuses a batch whose cache ([rows] sequences of `width` tokens) and token buffers cannot fit.
  The cache's size comes from the layer dimensions (HybridLM.cache_bytes, which equals the built
  cache's), not from tracing init_cache: a request's host time stays off its time to first token."""
  cache = rows * model.cache_bytes(width)["total"]
  check_memory(cache + 3 * rows * width * 4,  # the token buffers, int32
               f"generating max_new_tokens={max_new_tokens} for {rows} prompts (a cache of "
               f"{cache / 2**30:.1f} GiB for {width} tokens per row, plus the token buffers)")


def _check_ids(name: str, ids: np.ndarray, vocab_size: int):
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"`{name}` must hold token ids in [0, vocab_size={vocab_size}); got ids from "
                     f"{ids.min()} to {ids.max()}")


def _check_sampling(model, max_new_tokens, temperature, top_k, top_p, rng, eos_id=None):
  """Validates the sampling arguments shared by generate and generate_ragged; returns the rng."""
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
    raise ValueError(f"`max_new_tokens` must be an integer >= 1; got {max_new_tokens!r}")
  if max_new_tokens < 1:
    raise ValueError(f"`max_new_tokens` must be >= 1; got {max_new_tokens}")
  try:  # a Python or numpy number, or a 0-d array
    value = None if isinstance(temperature, (str, bytes)) else float(temperature)
  except (TypeError, ValueError):
    value = None
  if value is None or not (math.isfinite(value) and value >= 0):
    raise ValueError(f"`temperature` must be a finite number >= 0 (0: greedy); got {temperature!r}")
  if eos_id is not None and not 0 <= eos_id < model.config.vocab_size:
    raise ValueError(f"`eos_id` must be a token id in [0, vocab_size={model.config.vocab_size}); "
                     f"got {eos_id}")
  check_rng(rng)
  if top_k is not None and not 1 <= top_k <= model.config.vocab_size:
    raise ValueError(f"`top_k` must be in 1..vocab_size; got {top_k}")
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"`top_p` must be in (0, 1]; got {top_p}")
  if rng is None:
    if temperature != 0:
      raise ValueError("sampling with temperature > 0 needs `rng` (a jax.random key)")
    rng = jax.random.key(0)
  return rng


def check_rng(rng):
  """`rng` must be None or a jax.random key: a typed one (jax.random.key) or a raw uint32[2] one
  (jax.random.PRNGKey)."""
  if rng is None or (isinstance(rng, jax.Array) and (
      jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
      or (rng.dtype == jnp.uint32 and rng.shape == (2,)))):
    return
  raise ValueError(f"`rng` must be a jax.random key, e.g. jax.random.key(0); got "
                   f"{type(rng).__name__} {rng!r}")


def generate(model, prompt_ids, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, rng=None, eos_id: int | None = None):
  """Generates `max_new_tokens` tokens after `prompt_ids` [B, P] (equal-length prompts; prompts of
  different lengths: `generate_ragged`).

  Greedy unless sampling is asked for (as Hugging Face's generate): temperature > 0 samples, with
  `rng`; top_k / top_p filter before sampling; after `eos_id` a row repeats it.
  Returns [B, P + max_new_tokens] int32. The prompts are prefilled whole with the chunk ops, in
  one call padded to `length_bucket(P)` tokens (the loop of `generate_ragged`), so every P of one
  bucket runs the same compiled program: a new prompt length costs no compilation when its bucket
  was seen.
  """
  if isinstance(prompt_ids, (list, tuple)) and len({len(p) for p in prompt_ids}) > 1:
    raise ValueError(f"`prompt_ids` must be [B, P] (equal lengths); got prompts of lengths "
                     f"{[len(p) for p in prompt_ids]}: use generate_ragged for prompts of different lengths")
  ids = np.asarray(prompt_ids)
  if ids.ndim != 2 or ids.shape[1] < 1:
    raise ValueError(f"`prompt_ids` must be [B, P] with P >= 1; got shape {ids.shape}")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"`prompt_ids` must hold integer token ids; got dtype {ids.dtype}")
  _check_ids("prompt_ids", ids, model.config.vocab_size)
  rng = _check_sampling(model, max_new_tokens, temperature, top_k, top_p, rng, eos_id)
  B, P = ids.shape
  out = _run_bucketed(model, ids.tolist(), max_new_tokens, rng, temperature=temperature,
                      top_k=top_k, top_p=top_p, eos_id=eos_id, pad_id=0)[:, :P + max_new_tokens]
  if eos_id is not None:  # rows that finished early: their unwritten tail repeats eos
    new = out[:, P:]
    finished = np.any(new == eos_id, axis=1, keepdims=True)
    written = np.arange(max_new_tokens)[None, :] <= np.argmax(new == eos_id, axis=1)[:, None]
    out[:, P:] = np.where(finished & ~written, eos_id, new)
  return jnp.asarray(out)


def length_bucket(n: int, floor: int = 16) -> int:
  """The padded length of a batch whose longest prompt has `n` tokens: the next power of two, at
  least `floor` (so a stream of prompt lengths compiles a handful of programs, not one per length)."""
  return max(floor, 1 << max(0, int(n) - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "temperature", "top_k", "top_p",
                                             "eos_id"))
def _generate_ragged(model, tokens, lengths, rng, *, max_new_tokens, temperature, top_k, top_p,
                     eos_id):
  """tokens [B, T] (prompts left-aligned, T = padded prompt width + max_new_tokens), lengths [B]:
  the padded prompt width goes through the chunk ops in one call, whose first min(lengths) tokens
  are the prompt (HybridLM.step's `length`, traced: one program for every length); from there one
  token per step, the prompt's own token while a row is still inside its prompt, the sampled one
  after it. Every row then sees exactly its own prompt (no padding enters a state). Returns the
  tokens and how many of them the model read (the last token written is never read).

  The model goes in as a pytree (an nnx.Module is one): flattening it costs less host time per
  call than nnx.split, and jit's cache keys on its structure as it would on a split's graphdef."""
  B, T = tokens.shape
  sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)
  cache = model.init_cache(B, T)
  shortest = jnp.min(lengths)  # the tokens every row's prompt prefills
  logits, cache = model.step(tokens[:, :T - max_new_tokens], cache, last_only=True, fresh=True,
                             length=shortest)
  end = jnp.max(lengths) + max_new_tokens  # positions past it are never written

  def pick(t, logits, tokens, rng, done):
    """Token t of every row, written into `tokens`: the prompt's own while the row is inside its
    prompt, else sampled from `logits` (the model's after token t - 1)."""
    rng, key = jax.random.split(rng)
    sampled = sample(logits, key)
    in_prompt = t < lengths
    if eos_id is not None:
      sampled = jnp.where(done, eos_id, sampled)
    token = jnp.where(in_prompt, lax.dynamic_index_in_dim(tokens, t, axis=1, keepdims=False), sampled)
    if eos_id is not None:
      done = done | (~in_prompt & (token == eos_id))
    done = done | (t + 1 >= lengths + max_new_tokens)
    return lax.dynamic_update_index_in_dim(tokens, token, t, axis=1), token, rng, done

  def cond(carry):
    t, _, _, _, _, done = carry
    return (t + 1 < end) & ~jnp.all(done)

  def body(carry):  # the model reads token t, then token t + 1 is picked from its logits
    t, token, cache, tokens, rng, done = carry
    logits, cache = model.step(token[:, None], cache)
    tokens, token, rng, done = pick(t + 1, logits[:, -1], tokens, rng, done)
    return t + 1, token, cache, tokens, rng, done

  t = shortest
  tokens, token, rng, done = pick(t, logits[:, -1], tokens, rng, jnp.zeros((B,), bool))
  _, _, cache, tokens, _, _ = lax.while_loop(cond, body, (t, token, cache, tokens, rng, done))
  return tokens, cache["pos"]


def _run_bucketed(model, prompts: list[list[int]], max_new_tokens: int, rng, *, temperature, top_k,
                  top_p, eos_id, pad_id) -> np.ndarray:
  """The checked `prompts` through `_generate_ragged`, padded to `length_bucket` of the longest:
  [B, padded width + max_new_tokens] tokens."""
  lengths = np.array([len(p) for p in prompts], np.int32)
  width = length_bucket(int(lengths.max())) + int(max_new_tokens)
  _check_request(model, len(prompts), width, max_new_tokens)
  tokens = np.full((len(prompts), width), pad_id, np.int32)
  for row, p in zip(tokens, prompts):
    row[:len(p)] = p
  out, _ = _generate_ragged(model, jnp.asarray(tokens), jnp.asarray(lengths), rng,
                            max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                            top_k=top_k, top_p=top_p, eos_id=eos_id)
  return np.array(out)


def generate_ragged(model, prompts, max_new_tokens: int, *, temperature: float = 0.0,
                    top_k: int | None = None, top_p: float | None = None, rng=None,
                    eos_id: int | None = None, pad_id: int = 0) -> list[list[int]]:
  """Generates `max_new_tokens` tokens after each of `prompts` (sequences of token ids of any
  lengths, each >= 1) and returns the new tokens of each (cut after `eos_id` when given). Greedy
  unless temperature > 0 (with `rng`) asks for sampling, as `generate`.

  The batch is padded to `length_bucket` of the longest prompt and prefilled with the chunk ops in
  one call up to the shortest prompt's length; the rest of each longer prompt is fed one token per
  step in the decode loop, so no row's state sees padding and the results equal `generate` on each
  prompt alone. Batches whose longest prompts fall in one bucket share one compiled program, the
  shortest prompt's length being a traced value (sort a stream of prompts by length and batch
  neighbours: each prompt token past the shortest prompt costs a decode step).
  """
  prompts = [list(map(int, p)) for p in prompts]
  if not prompts or any(len(p) < 1 for p in prompts):
    raise ValueError("`prompts` must be a non-empty list of token id sequences, each of length >= 1; "
                     f"got lengths {[len(p) for p in prompts]}")
  for i, p in enumerate(prompts):
    _check_ids(f"prompts[{i}]", np.asarray(p), model.config.vocab_size)
  rng = _check_sampling(model, max_new_tokens, temperature, top_k, top_p, rng, eos_id)
  out = _run_bucketed(model, prompts, max_new_tokens, rng, temperature=temperature, top_k=top_k,
                      top_p=top_p, eos_id=eos_id, pad_id=pad_id)
  new = [out[i, len(p):len(p) + max_new_tokens].tolist() for i, p in enumerate(prompts)]
  if eos_id is not None:
    new = [row[:row.index(eos_id) + 1] if eos_id in row else row for row in new]
  return new
