"""The torch side of benchmarks/generation.py (torch, transformers and fla only; no JAX): Hugging
Face `generate` of fla's GatedDeltaNetForCausalLM, of the same model with attention at every 4th
layer through fla's `attn` config (3:1), and of HF's LlamaForCausalLM, in bf16 on random weights,
written as JSON for generation.py to print beside ours.

    python benchmarks/torch_generation.py --out DIR [--prompt 2048 --new_tokens 256 --batches 1,64]
                                                # writes DIR/torch_generation.json

Models: torch_train_step.py's (fla's 340M Gated DeltaNet configuration, 475M parameters; a Llama of
its depth and width, 374M), and the hybrid: that Gated DeltaNet with attention layers 3, 7, ..., 23
(16 heads of 64, RoPE 10,000, no window), the layers lineax_lm's `attn_ratio="3:1"` picks.

Per model and batch, on --batches rows of --prompt random tokens (times are medians of up to
--repeats calls after a warm-up call, each measure stopping once it has spent --measure_s):
  prefill_s       one forward over the prompt with a fresh cache (use_cache=True, the last
                  position's logits only, as generate's own first forward)
  ttft_s          generate(max_new_tokens=1)
  generate_s      generate(max_new_tokens=N, min_new_tokens=N), greedy: exactly N new tokens
  decode          batch x (N - 1) / (generate_s - ttft_s) tokens/s: the steps after the first token
  first_call_s    the first generate(N) call (Triton's compilation and autotuning included)
  ttft_new_length_s, ttft_same_bucket_s   at the smallest batch: generate(max_new_tokens=1) on two
                  prompt lengths not seen before (new_lengths), the same ones generation.py gives
                  ours, where both reuse the compiled program of the prompt's length bucket
  peak_GiB        torch.cuda.max_memory_allocated over the batch's measures
Each model and batch runs in its own try: an error is recorded and the rest still run; the JSON is
rewritten after every measure, so a caller's time limit keeps what was measured.

fla's attention layers import flash_attn, which the GPU host lacks: benchmarks/make_fla_fixtures.py's
stand-in over torch SDPA serves them (exact=False: SDPA's own kernel choice, no mask where none is
needed, one call per varlen batch of equal lengths). Without a GPU, fla runs under Triton's
interpreter (make_fla_fixtures.import_fla "cpu"), in float32 at the sizes --layers, --hidden and
--vocab give: for running this script end to end, not for timing.

This module imports torch only inside its functions, so that generation.py can import
`median_time` and `new_lengths`, the measuring rules both sides share.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import traceback

FLA_MODELS = ("fla_gated_deltanet_340m", "fla_gated_deltanet_340m_hybrid_3_1")
MODEL_NAMES = ("hf_llama_sdpa",) + FLA_MODELS


def new_lengths(prompt: int) -> tuple[int, int]:
  """Two prompt lengths below `prompt` that a warmed-up generator has not seen: 3/4 and 7/8 of it
  (for a power of two >= 16 both fall in the length bucket of `prompt` itself, whose compiled
  program lineax_lm reuses)."""
  return max(1, prompt * 3 // 4), max(1, prompt * 7 // 8)


def median_time(call, repeats: int, limit_s: float) -> tuple[float, int]:
  """(median seconds, calls timed) of up to `repeats` calls of `call` (which waits for its device
  work), stopping once `limit_s` has been spent; at least one call."""
  times, start = [], time.perf_counter()
  while len(times) < repeats and (not times or time.perf_counter() - start < limit_s):
    t = time.perf_counter()
    call()
    times.append(time.perf_counter() - t)
  return statistics.median(times), len(times)


def build(name: str, seq: int, sizes: dict):
  """The torch model `name` (MODEL_NAMES) for prompts of `seq` tokens; `sizes` (layers, hidden,
  vocab; head_dim of the Gated DeltaNet layers) override torch_train_step.py's."""
  from torch_train_step import LAYERS, fla_gated_deltanet, hf_llama
  fields = {field: sizes[key] for key, field in (("layers", "num_hidden_layers"),
                                                 ("hidden", "hidden_size"), ("vocab", "vocab_size"))
            if sizes.get(key)}
  if name == "hf_llama_sdpa":
    return hf_llama(seq, **fields)
  if sizes.get("head_dim"):
    fields["head_dim"] = sizes["head_dim"]
  if name == "fla_gated_deltanet_340m_hybrid_3_1":
    layers = fields.get("num_hidden_layers", LAYERS)
    fields["attn"] = dict(layers=list(range(3, layers, 4)), num_heads=16, num_kv_heads=16,
                          qkv_bias=False, window_size=None, rope_theta=10000.0)
  return fla_gated_deltanet(seq, **fields)


def measure(model, batch: int, a, row: dict, save, device: str, first: bool) -> None:
  """Fills `row` with the figures of `model` at `batch` (the module docstring's), calling save()
  after each."""
  import torch
  cuda = device == "cuda"

  def sync():
    if cuda:
      torch.cuda.synchronize()

  gen = torch.Generator(device=device).manual_seed(0)
  ids = torch.randint(0, model.config.vocab_size, (batch, a.prompt), device=device, generator=gen)

  def generate(prompt, new):
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                         min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0)
    sync()
    return out

  def prefill():
    with torch.no_grad():
      model(input_ids=ids, use_cache=True, logits_to_keep=1)
    sync()

  if cuda:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  t = time.perf_counter()
  out = generate(ids, a.new_tokens)
  row["first_call_s"] = time.perf_counter() - t
  want = (batch, a.prompt + a.new_tokens)
  if tuple(out.shape) != want:
    raise RuntimeError(f"generate returned {tuple(out.shape)} tokens, not {want}")
  row["generate_s"], row["repeats"] = median_time(lambda: generate(ids, a.new_tokens), a.repeats,
                                                  a.measure_s)
  save()
  generate(ids, 1)
  row["ttft_s"], _ = median_time(lambda: generate(ids, 1), a.repeats, a.measure_s)
  prefill()
  row["prefill_s"], _ = median_time(prefill, a.repeats, a.measure_s)
  decode_s = row["generate_s"] - row["ttft_s"]
  row.update(decode_tokens_per_s=batch * (a.new_tokens - 1) / decode_s,
             step_ms=decode_s / (a.new_tokens - 1) * 1e3)
  save()
  if first:
    row["new_lengths"] = new_lengths(a.prompt)
    for key, length in zip(("ttft_new_length_s", "ttft_same_bucket_s"), row["new_lengths"]):
      t = time.perf_counter()
      generate(ids[:, :length], 1)
      row[key] = time.perf_counter() - t
  row["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
  save()


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.environ.get("OUT", "."))
  p.add_argument("--prompt", type=int, default=2048)
  p.add_argument("--new_tokens", type=int, default=256)
  p.add_argument("--batches", default="1,64")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--measure_s", type=float, default=10.0)
  p.add_argument("--layers", type=int, help="layers of every model (default: 24)")
  p.add_argument("--hidden", type=int, help="width of every model (default: 1,024)")
  p.add_argument("--vocab", type=int, help="vocabulary of every model (default: 32,000)")
  p.add_argument("--head_dim", type=int,
                 help="head dim of fla's Gated DeltaNet layers (default: 256; 16 makes a CPU run "
                 "under Triton's interpreter quick)")
  p.add_argument("--models", default=",".join(MODEL_NAMES),
                 help="comma-separated, run in this order (HF Llama first by default: it needs no "
                 "autotuning, so a time limit that stops fla's still leaves its rows)")
  a = p.parse_args()
  batches = [int(b) for b in a.batches.split(",")]
  models = a.models.split(",")
  unknown = sorted(set(models) - set(MODEL_NAMES))
  if unknown:
    p.error(f"--models: unknown {unknown}; choose from {list(MODEL_NAMES)}")
  if a.new_tokens < 2:
    p.error("--new_tokens must be >= 2 (decode is timed over the tokens after the first)")
  import torch
  device = "cuda" if torch.cuda.is_available() else "cpu"
  result = dict(prompt=a.prompt, new_tokens=a.new_tokens, batches=batches, torch=torch.__version__,
                device=torch.cuda.get_device_name() if device == "cuda" else "CPU", rows=[])
  fla_error = None
  if set(models) & set(FLA_MODELS):
    from make_fla_fixtures import import_fla
    try:
      result["fla"] = import_fla(device, exact=False).__version__
    except SystemExit as e:  # fla or its wheels missing: its rows say so, Llama's still run
      fla_error = str(e)
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "torch_generation.json")

  def save():
    with open(path, "w") as f:
      json.dump(result, f, indent=1)

  dtype = torch.bfloat16 if device == "cuda" else torch.float32
  sizes = dict(layers=a.layers, hidden=a.hidden, vocab=a.vocab, head_dim=a.head_dim)
  for name in models:
    model = None
    try:
      if name in FLA_MODELS and fla_error:
        raise RuntimeError(fla_error)
      model = build(name, a.prompt + a.new_tokens, sizes).to(device=device, dtype=dtype).eval()
      params = sum(p.numel() for p in model.parameters()) / 1e6
      for i, batch in enumerate(batches):
        row = dict(model=name, batch=batch, params_M=params, dtype=str(dtype).removeprefix("torch."))
        result["rows"].append(row)
        try:
          measure(model, batch, a, row, save, device, first=i == 0)
        except Exception as e:
          row.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        finally:  # an OOM's traceback holds the batch's tensors: free them before the next
          gc.collect()
          if device == "cuda":
            torch.cuda.empty_cache()
        save()
        print(name, json.dumps(row)[:400], flush=True)
    except Exception as e:
      result["rows"].append(dict(model=name, error=f"{type(e).__name__}: {e}",
                                 traceback=traceback.format_exc()[-4000:]))
      save()
      print(name, "error:", result["rows"][-1]["error"], flush=True)
    del model
    gc.collect()
  save()
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
