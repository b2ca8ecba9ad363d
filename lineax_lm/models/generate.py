"""Generation with a cache: prefill with the chunk ops, then one token at a time with the
fused_recurrent ops inside one jit-compiled `lax.while_loop` (cache sizes: `models.cache`).

The cache (HybridLM.init_cache) is a pytree {"pos": int32, "layers": [...]}: each linear layer keeps
its float32 recurrent state and short-convolution inputs (constant size), each attention layer a KV
cache of max_len slots (2 * kv_heads * head_dim values per token).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
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


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature", "top_k",
                                             "top_p", "eos_id"))
def _generate(graphdef, state, prompt, rng, *, max_new_tokens, temperature, top_k, top_p, eos_id):
  model = nnx.merge(graphdef, state)
  B, P = prompt.shape
  sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k, top_p=top_p)
  cache = model.init_cache(B, P + max_new_tokens)
  logits, cache = model.step(prompt, cache)                               # prefill: chunk ops
  rng, key = jax.random.split(rng)
  token = sample(logits[:, -1], key)
  out = jnp.zeros((B, max_new_tokens), jnp.int32).at[:, 0].set(token)
  done = jnp.zeros((B,), bool) if eos_id is None else token == eos_id

  def cond(carry):
    i, _, _, _, _, done = carry
    return (i < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    i, token, cache, out, rng, done = carry
    logits, cache = model.step(token[:, None], cache)                     # decode: fused_recurrent
    rng, key = jax.random.split(rng)
    nxt = sample(logits[:, -1], key)
    if eos_id is not None:
      nxt = jnp.where(done, eos_id, nxt)
      done = done | (nxt == eos_id)
    return i + 1, nxt, cache, out.at[:, i].set(nxt), rng, done

  carry = (jnp.ones((), jnp.int32), token, cache, out, rng, done)
  *_, out, _, _ = lax.while_loop(cond, body, carry)
  if eos_id is not None:  # rows that finished early: fill the unwritten tail with eos
    written = jnp.arange(max_new_tokens)[None, :] <= jnp.argmax(out == eos_id, axis=1)[:, None]
    finished = jnp.any(out == eos_id, axis=1, keepdims=True)
    out = jnp.where(finished & ~written, eos_id, out)
  return jnp.concatenate([prompt, out], axis=1)


def generate(model, prompt_ids, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, rng=None, eos_id: int | None = None):
  """Samples `max_new_tokens` tokens after `prompt_ids` [B, P] (equal-length prompts).

  temperature == 0 is greedy; top_k / top_p filter before sampling; after `eos_id` a row repeats it.
  Returns [B, P + max_new_tokens] int32. The whole loop is one compiled function per shape and
  sampling setting.
  """
  prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
  if prompt_ids.ndim != 2 or prompt_ids.shape[1] < 1:
    raise ValueError(f"`prompt_ids` must be [B, P] with P >= 1; got shape {prompt_ids.shape}")
  if max_new_tokens < 1:
    raise ValueError(f"`max_new_tokens` must be >= 1; got {max_new_tokens}")
  if temperature < 0:
    raise ValueError(f"`temperature` must be >= 0; got {temperature}")
  if top_k is not None and not 1 <= top_k <= model.config.vocab_size:
    raise ValueError(f"`top_k` must be in 1..vocab_size; got {top_k}")
  if top_p is not None and not 0 < top_p <= 1:
    raise ValueError(f"`top_p` must be in (0, 1]; got {top_p}")
  if rng is None:
    if temperature != 0:
      raise ValueError("sampling with temperature > 0 needs `rng` (a jax.random key)")
    rng = jax.random.key(0)
  graphdef, state = nnx.split(model)
  return _generate(graphdef, state, prompt_ids, rng, max_new_tokens=int(max_new_tokens),
                   temperature=float(temperature), top_k=top_k, top_p=top_p, eos_id=eos_id)
