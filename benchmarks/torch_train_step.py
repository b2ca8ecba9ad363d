"""The torch side of benchmarks/train_step.py (torch, transformers and fla only; no JAX): training
throughput and peak memory of fla's GatedDeltaNetForCausalLM and HF's LlamaForCausalLM, trained the
way lineax_lm's step trains (float32 weights, bf16 autocast, fused AdamW, clipping at 1.0) on random
tokens, written as JSON for train_step.py to print beside ours.

    python benchmarks/torch_train_step.py --out DIR [--long] [--batch 8 --seq 4096] [--steps 10] [--remat]
                                                     # writes DIR/torch_train_step.json

Models: fla's 340M Gated DeltaNet configuration (hidden 1024, 24 layers, 4 heads x 256, expand_v 2,
short convolutions, vocab 32,000, untied: 475M parameters; fla's default fused cross-entropy) and a
Llama of the same depth and width (16 heads, MLP 2,816, SDPA attention: 374M). --long: B=1,
T=32,768. tokens/s uses the median step time over --steps steps after --warmup steps; peak is
torch.cuda.max_memory_allocated over the model's whole run (build, warm-up and timed steps). Each
model runs in its own try: an error is recorded in the JSON and the next model still runs.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import traceback

import torch

from torch_kernels import busy_ms

VOCAB, LAYERS, HIDDEN = 32000, 24, 1024


def fla_gated_deltanet(seq: int, **fields):
  """fla's 340M Gated DeltaNet configuration (fla's GatedDeltaNetConfig `fields` override it, e.g.
  `attn` for a hybrid)."""
  # fla refuses its gated backward kernels on Hopper with Triton < 3.7.1 (as benchmarks/fla_ops.py)
  try:
    import fla.ops.common.chunk_o as chunk_o
    chunk_o.TRITON_ABOVE_3_7_1 = True
  except (ImportError, AttributeError):
    pass
  from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM
  config = GatedDeltaNetConfig(**{**dict(
      hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_heads=4, head_dim=256, expand_v=2.0,
      use_gate=True, use_short_conv=True, conv_size=4, hidden_ratio=4, norm_eps=1e-6,
      vocab_size=VOCAB, tie_word_embeddings=False, max_position_embeddings=seq), **fields})
  return GatedDeltaNetForCausalLM(config)


def hf_llama(seq: int, **fields):
  """A Llama of the Gated DeltaNet's depth and width (LlamaConfig `fields` override it)."""
  from transformers import LlamaConfig, LlamaForCausalLM
  config = LlamaConfig(**{**dict(
      vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2816, num_hidden_layers=LAYERS,
      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=seq,
      tie_word_embeddings=False, attn_implementation="sdpa"), **fields})  # RoPE theta: 10,000
  return LlamaForCausalLM(config)


MODELS = {"hf_llama_sdpa": hf_llama, "fla_gated_deltanet_340m": fla_gated_deltanet}


def measure(build, batch: int, seq: int, warmup: int, steps: int, profile: int = 0,
            table_path: str = "", remat: bool = False) -> dict:
  torch.cuda.empty_cache()
  torch.cuda.reset_peak_memory_stats()
  started = time.perf_counter()
  model = build(seq).cuda().float().train()
  if remat:  # each layer's activations recomputed in the backward (lineax_lm's remat="full")
    model.gradient_checkpointing_enable()
  params = sum(p.numel() for p in model.parameters())
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                          weight_decay=0.1, fused=True)
  gen = torch.Generator(device="cuda").manual_seed(0)
  tokens = [torch.randint(0, VOCAB, (batch, seq), device="cuda", generator=gen) for _ in range(2)]

  def step(ids):
    with torch.autocast("cuda", dtype=torch.bfloat16):
      loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

  loss = step(tokens[0])
  torch.cuda.synchronize()
  first_step_s = time.perf_counter() - started
  for i in range(warmup):
    step(tokens[i % 2])
  torch.cuda.synchronize()
  times = []
  for i in range(steps):
    t = time.perf_counter()
    loss = step(tokens[i % 2])
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  row = dict(params_M=params / 1e6, step_s=step_s, tokens_per_s=batch * seq / step_s,
             peak_GiB=torch.cuda.max_memory_allocated() / 2**30, first_step_s=first_step_s,
             loss=float(loss))
  if profile:
    row["busy_ms"] = busy_ms(lambda: step(tokens[0]), table_path, profile)
  del model, opt, tokens
  return row


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.environ.get("OUT", "."))
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=4096)
  p.add_argument("--long", action="store_true", help="B=1, T=32,768 (overrides --batch/--seq)")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--profile", type=int, default=0,
                 help="a torch.profiler trace of this many more steps a model: its busy time, and "
                 "the per-kernel table in torch_<model>.kernels.txt beside the JSON")
  p.add_argument("--remat", action="store_true",
                 help="gradient checkpointing on every layer (what lineax_lm's remat=full does)")
  p.add_argument("--models", default=",".join(MODELS),
                 help="comma-separated, run in this order (HF Llama first by default: it needs no "
                 "autotuning, so a time limit that stops fla's still leaves its row)")
  a = p.parse_args()
  batch, seq = (1, 32768) if a.long else (a.batch, a.seq)
  result = dict(batch=batch, seq=seq, torch=torch.__version__, models={})
  try:
    result["device"] = torch.cuda.get_device_name()
  except Exception as e:  # no GPU: every model below records its own error
    result["device"] = f"unavailable: {e}"
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "torch_train_step.json")
  for name in a.models.split(","):
    try:
      result["models"][name] = measure(MODELS[name], batch, seq, a.warmup, a.steps, a.profile,
                                        os.path.join(a.out, f"torch_{name}.kernels.txt"), a.remat)
    except Exception as e:
      result["models"][name] = dict(error=f"{type(e).__name__}: {e}",
                                    traceback=traceback.format_exc()[-4000:])
    finally:  # an OOM's traceback holds the model: free it before the next one
      gc.collect()
      torch.cuda.empty_cache()
    print(name, json.dumps(result["models"][name])[:500], flush=True)
    # Written after every model: a caller's time limit that stops fla's autotuning keeps the rows
    # already measured.
    with open(path, "w") as f:
      json.dump(result, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
