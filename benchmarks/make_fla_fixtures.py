"""Parity fixtures made by fla itself, for tests/lineax_lm/convert/test_fla_parity.py: a tiny random
model of each fla model type lineax_lm reads (pure, and 3:1 hybrid through fla's `attn` config),
saved with fla's save_pretrained, with its float32 logits on fixed token ids and its greedy
continuation.

On the GPU host (torch, triton and transformers are there; fla 0.6.0 and einops come as wheels in
.whl/, git-ignored: `pip download --no-deps flash-linear-attention==0.6.0 fla-core==0.6.0
einops`), one device call with carry [".whl"]:

    python3 -m pip install -q --no-index --no-deps --target /tmp/fla \\
        .whl/flash_linear_attention-0.6.0-*.whl .whl/fla_core-0.6.0-*.whl .whl/einops-*.whl
    PYTHONPATH=/tmp/fla python3 benchmarks/make_fla_fixtures.py --out tests/lineax_lm/convert/fixtures
    cp -r tests/lineax_lm/convert/fixtures $OUT/fla_fixtures
    source launch/h200_env.sh && install_missing_wheels && JAX_PLATFORMS=cpu \\
        python3 -m pytest -q -p no:cacheprovider tests/lineax_lm/convert/test_fla_parity.py

(the last two lines check the fixtures against lineax_lm in the same call, on the host's CPU; .whl/
then also needs the wheels launch/h200_env.sh installs); then copy $OUT/fla_fixtures/* into
tests/lineax_lm/convert/fixtures/ and commit them (about 3 MB). `--only gla,gla_hybrid` makes some
of them, should one call not fit them all.

Each fixture folder <type>[_hybrid]/ holds fla's config.json and model.safetensors, reference.json
(versions, device, date, command) and reference.safetensors: input_ids [2, 32] (seed 0), logits
[2, 32, vocab] float32, prompt_ids [2, 8] (the first 8 of input_ids) and greedy_ids [2, 16], the
argmax continuation of the prompts, each step one full forward of the tokens so far.

fla's float32 path: the models are float32, TF32 is off for matmuls and convolutions, and every
forward runs under torch.no_grad() on at most 32 tokens, so that each fla layer takes its
fused_recurrent kernel (each layer of these types picks it for sequences of at most 64 tokens
outside training): the token-by-token recurrence in float32, not the chunked form. fla's attention
layer calls flash_attn, which the host lacks: a stand-in module computes its two functions with
torch's scaled_dot_product_attention in float32 (its math backend; causal and window masks
aligned as flash_attn aligns them), installed in this process only.

On a CPU (no GPU): `--device cpu` runs fla's Triton kernels under Triton's interpreter
(TRITON_INTERPRET=1, set by the script before triton is imported) with a CPU build of torch, in a
venv of its own:

    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch triton \
        transformers==5.17.0 einops safetensors
    /tmp/torchenv/bin/pip install --no-deps .whl/flash_linear_attention-0.6.0-*.whl \
        .whl/fla_core-0.6.0-*.whl
    /tmp/torchenv/bin/python benchmarks/make_fla_fixtures.py --device cpu --out DIR --only NAMES

No CUDA is needed (the flash_attn stand-in serves the hybrids here too). fla's own device
detection falls back to "cpu" without a GPU driver; the one change made to what fla runs is to
Triton's autotuner, which cannot time configs without a driver: each autotuned kernel runs the
first of its configs (the configs of the kernels these forwards take differ in launch settings,
which the interpreter does not model, or in how many rows or channels one program takes, which
changes no row's or channel's arithmetic). fla's math is unchanged: `--compare --out DIR`
recomputes the logits and greedy tokens of the fixtures in DIR on --device from their saved
weights and prints how far they are from the saved ones (the GPU-made gla, gated_deltanet and
hgrn2_hybrid fixtures recomputed on the CPU: logits within 3.5e-6 of the largest logit, greedy
tokens equal). The rwkv6 fixtures were made this way on the CPU. The interpreter is slow: a fixture's 17 forwards take one to several minutes on
two busy cores. Fixtures made on the CPU differ from GPU-made ones in their random weights
(torch's CPU and CUDA generators differ), not in how fla computes.

Weights: fla's initialisation with initializer_range 0.2 (at 0.02 the tiny models' logits are all
~0 and ties decide greedy tokens), then every parameter plus normal(0, 0.1) noise, so that norms,
biases, HGRN's lower bounds and the other constant-initialised parameters are exercised too.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import datetime
import json
import os
import sys
import types

VOCAB, HIDDEN, TOKENS, BATCH, PROMPT, NEW_TOKENS = 64, 32, 32, 2, 8, 16
COMMON = dict(hidden_size=HIDDEN, vocab_size=VOCAB, intermediate_size=64, initializer_range=0.2,
              norm_eps=1e-6, fuse_cross_entropy=False)
# fla model type -> its tiny settings (2 heads of 16 where it has heads)
TYPES = {
    "gla": dict(num_heads=2),
    "gated_deltanet": dict(num_heads=2, head_dim=16),
    "delta_net": dict(num_heads=2),
    "hgrn": dict(),
    "hgrn2": dict(expand_ratio=16),
    "retnet": dict(num_heads=2),
    "kda": dict(num_heads=2, head_dim=16),
    "linear_attn": dict(num_heads=2),
    "rwkv6": dict(num_heads=2, proj_low_rank_dim=8, gate_low_rank_dim=8),
    "transformer": dict(num_heads=4, num_kv_heads=2, tie_word_embeddings=True),
}
# The hybrids: 4 layers, attention at layer 3 (3:1) with grouped key/value heads; some with a
# sliding window shorter than the sequence, another RoPE base or another mixer option, so that those
# options are compared too.
ATTENTION = dict(layers=[3], num_heads=4, num_kv_heads=2, qkv_bias=False, window_size=None,
                 rope_theta=10000.0)
HYBRID_ATTENTION = {"gla": dict(window_size=8), "gated_deltanet": dict(rope_theta=500000.0),
                    "hgrn2": dict(window_size=12)}
HYBRID_FIELDS = {"gated_deltanet": dict(output_gate_activation="sigmoid")}


def fixtures() -> dict:
  """{fixture name: fla config fields}: each type pure (2 layers) and, but for the transformer, as
  a 3:1 hybrid (4 layers)."""
  out = {}
  for model_type, fields in TYPES.items():
    out[model_type] = dict(model_type=model_type, num_hidden_layers=2, **COMMON, **fields)
    if model_type != "transformer":
      attn = {**ATTENTION, **HYBRID_ATTENTION.get(model_type, {})}
      out[f"{model_type}_hybrid"] = dict(model_type=model_type, num_hidden_layers=4, attn=attn,
                                         **COMMON, **fields, **HYBRID_FIELDS.get(model_type, {}))
  return out


def install_flash_attn_stand_in(exact: bool = True):
  """Registers a `flash_attn` module (this process only) whose flash_attn_func and
  flash_attn_varlen_func compute attention with torch's SDPA: q [B, Tq, H, D], k and v
  [B, Tk, Hkv, D] (query head h reads key/value head h // (H / Hkv)); causal masks align the last
  query with the last key, and window_size (left, right) keeps keys within left before and right
  after each query (-1: unbounded), as flash_attn does.

  exact: SDPA's math backend (the fixtures' float32 references). Otherwise, for timings, SDPA
  picks its kernel (flash or memory-efficient), a mask that masks nothing is left out (a causal
  square one becomes is_causal), and a varlen batch whose sequences share one length runs as one
  batch rather than one call per sequence."""
  import torch
  import torch.nn.functional as F
  from torch.nn.attention import SDPBackend, sdpa_kernel

  def attend(q, k, v, softmax_scale, causal, window_size):
    tq, tk = q.shape[1], k.shape[1]
    unbounded = window_size[0] < 0 and window_size[1] < 0
    if not exact and unbounded and (not causal or tq == 1 or tq == tk):
      # no mask (a single query's causal mask keeps every key), or the square causal one
      o = F.scaled_dot_product_attention(
          q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale,
          is_causal=causal and tq > 1, enable_gqa=q.shape[2] != k.shape[2])
      return o.transpose(1, 2)
    groups = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(groups, dim=2) for t in (k, v))
    q_pos = torch.arange(tk - tq, tk, device=q.device)[:, None]
    k_pos = torch.arange(tk, device=q.device)[None, :]
    mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device)
    left, right = window_size
    if causal:
      mask &= k_pos <= q_pos
    if left >= 0:
      mask &= k_pos >= q_pos - left
    if right >= 0:
      mask &= k_pos <= q_pos + right
    with sdpa_kernel(SDPBackend.MATH):  # plain float32 matmuls and softmax (TF32 is off)
      o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, scale=softmax_scale)
    return o.transpose(1, 2)

  def unsupported(kwargs):
    used = {k: v for k, v in kwargs.items() if v not in (None, 0, 0.0, False)}
    if used:
      raise NotImplementedError(f"the flash_attn stand-in does not implement {sorted(used)}")

  def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                      window_size=(-1, -1), **kwargs):
    unsupported({"dropout_p": dropout_p, **kwargs})
    return attend(q, k, v, softmax_scale, causal, window_size)

  def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), **kwargs):
    unsupported({"dropout_p": dropout_p, **kwargs})
    if not exact:
      len_q, len_k = set(cu_seqlens_q.diff().tolist()), set(cu_seqlens_k.diff().tolist())
      if len(len_q) == 1 and len(len_k) == 1:
        batch = len(cu_seqlens_q) - 1
        return attend(q.unflatten(0, (batch, -1)), k.unflatten(0, (batch, -1)),
                      v.unflatten(0, (batch, -1)), softmax_scale, causal, window_size).flatten(0, 1)
    outs = []
    for i in range(len(cu_seqlens_q) - 1):
      sq, eq = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
      sk, ek = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
      outs.append(attend(q[None, sq:eq], k[None, sk:ek], v[None, sk:ek], softmax_scale, causal,
                         window_size)[0])
    return torch.cat(outs)

  module = types.ModuleType("flash_attn")
  # transformers asks importlib.util.find_spec whether flash_attn is there, which needs a spec; with
  # no distribution metadata behind it, transformers still counts flash_attn as absent
  module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
  module.__doc__ = "A stand-in for flash_attn over torch SDPA (benchmarks/make_fla_fixtures.py)."
  module.flash_attn_func, module.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
  sys.modules["flash_attn"] = module


def import_fla(device: str = "cuda", exact: bool = True):
  """fla 0.6.0 with the flash_attn stand-in (`exact`: install_flash_attn_stand_in's); exits with
  the reason when fla or torch is missing. device "cpu": fla's Triton kernels under Triton's
  interpreter, each autotuned kernel on its first config (the interpreter has no driver to time
  them with)."""
  if device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
  try:
    import torch  # noqa: F401
  except ImportError:
    sys.exit("make_fla_fixtures.py needs torch (the GPU host has it)")
  if device == "cpu":
    try:
      from triton.runtime import autotuner
    except ImportError:
      sys.exit("make_fla_fixtures.py --device cpu needs triton (pip install triton)")
    prune = autotuner.Autotuner.prune_configs
    autotuner.Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]
  install_flash_attn_stand_in(exact)
  try:
    import fla
    import fla.models  # noqa: F401  registers fla's configs and models with transformers' Auto*
  except ImportError as e:
    sys.exit(f"make_fla_fixtures.py needs fla 0.6.0 and einops ({e}); install the wheels of .whl/ "
             "as this script's docstring says and put them on PYTHONPATH")
  if fla.__version__ != "0.6.0":
    sys.exit(f"make_fla_fixtures.py makes its fixtures with fla 0.6.0; found fla {fla.__version__}")
  return fla


def make_fixture(name: str, fields: dict, out: str, device: str, command: str) -> dict:
  import torch
  import transformers
  from safetensors.torch import save_file
  from transformers import AutoConfig, AutoModelForCausalLM

  import fla
  torch.manual_seed(0)
  model_type = fields.pop("model_type")
  config = AutoConfig.for_model(model_type, **fields)
  model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch.float32).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.1)
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=gen).to(device)
  logits, ids, margins = run_fla(model, input_ids)
  folder = os.path.join(out, name)
  model.save_pretrained(folder)  # safetensors: the default of transformers >= 4.35
  save_file({"input_ids": input_ids.cpu().contiguous(), "logits": logits.cpu().contiguous(),
             "prompt_ids": input_ids[:, :PROMPT].cpu().contiguous(),
             "greedy_ids": ids[:, PROMPT:].cpu().contiguous()},
            os.path.join(folder, "reference.safetensors"))
  meta = dict(fla=fla.__version__, torch=torch.__version__, transformers=transformers.__version__,
              device=(torch.cuda.get_device_name() if device == "cuda"
                      else "CPU (Triton interpreter)"),
              date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              command=command, min_greedy_margin=min(margins),
              mode="float32, torch.no_grad(), TF32 off: fla's fused_recurrent kernels (<= 64 tokens)")
  with open(os.path.join(folder, "reference.json"), "w") as f:
    json.dump(meta, f, indent=1, sort_keys=True)
  return meta


def run_fla(model, input_ids):
  """fla's float32 logits of `input_ids` [B, T], and the greedy continuation of their first PROMPT
  tokens (each step one full forward of the tokens so far): (logits, prompt + NEW_TOKENS ids,
  the top-2 logit gap of each greedy step)."""
  import torch
  with torch.no_grad():
    logits = model(input_ids=input_ids, use_cache=False).logits.float()
    ids, margins = input_ids[:, :PROMPT], []
    for _ in range(NEW_TOKENS):
      last = model(input_ids=ids, use_cache=False).logits[:, -1].float()
      top2 = last.topk(2, dim=-1).values
      margins.append(float((top2[:, 0] - top2[:, 1]).min()))
      ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)
  return logits, ids, margins


def compare_fixture(folder: str, device: str) -> str:
  """fla's logits and greedy tokens recomputed on `device` from fixture `folder`'s saved weights,
  against the saved ones: a line with the largest logit difference relative to the largest logit."""
  import torch
  from safetensors.torch import load_file
  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
  ref = load_file(os.path.join(folder, "reference.safetensors"))
  logits, ids, _ = run_fla(model, ref["input_ids"].to(device))
  want = ref["logits"]
  gap = float((logits.cpu() - want).abs().max() / want.abs().max())
  same = torch.equal(ids[:, PROMPT:].cpu(), ref["greedy_ids"])
  return (f"{os.path.basename(folder)}: logits within {gap:.2e} of the largest logit; greedy "
          f"tokens {'equal' if same else 'DIFFER'}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="folder that receives one folder per fixture")
  parser.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
  parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                      help="cuda: fla's Triton kernels on the GPU; cpu: under Triton's interpreter")
  parser.add_argument("--compare", action="store_true",
                      help="recompute the fixtures already in --out from their saved weights and "
                           "print how far fla's logits and greedy tokens on --device are from them")
  args = parser.parse_args()
  import_fla(args.device)
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  torch.set_float32_matmul_precision("highest")
  if args.device == "cuda" and not torch.cuda.is_available():
    sys.exit("make_fla_fixtures.py needs a GPU (fla's kernels are Triton kernels) or --device cpu")
  wanted = fixtures()
  only = [n for n in args.only.split(",") if n]
  unknown = sorted(set(only) - set(wanted))
  if unknown:
    sys.exit(f"unknown fixture(s) {unknown}; known: {sorted(wanted)}")
  if args.compare:
    for name in wanted:
      if (not only or name in only) and os.path.isdir(os.path.join(args.out, name)):
        print(compare_fixture(os.path.join(args.out, name), args.device), flush=True)
    return
  command = "python3 " + " ".join(sys.argv)
  failed = []
  for name, fields in wanted.items():
    if only and name not in only:
      continue
    try:
      meta = make_fixture(name, dict(fields), args.out, args.device, command)
      gap = meta["min_greedy_margin"]
      print(f"{name}: written (smallest top-2 logit gap of the greedy steps {gap:.2e}"
            + ("; below 1e-3, float32 rounding may pick the other token)" if gap < 1e-3 else ")"),
            flush=True)
    except Exception as e:  # one type's failure must not cost the others' fixtures
      failed.append(name)
      print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
  if failed:
    sys.exit(f"fixtures not written: {failed}")


if __name__ == "__main__":
  main()
