"""lineax_lm against fla itself: each fixture in fixtures/ is a tiny random fla 0.6.0 model of one
type, pure or 3:1 hybrid, saved by fla with its float32 logits on fixed token ids and its greedy
continuation (made on the GPU host by benchmarks/make_fla_fixtures.py, the rwkv6 ones on a CPU
under Triton's interpreter; each reference.json says where; the script's docstring gives the
commands and how fla computed them). Imported with lineax_lm.from_pretrained, the model's logits
match fla's within 1e-4 relative to the largest logit: |ours - fla| <= 1e-4 * (|fla| +
max |fla|), both float32 (fla's fused_recurrent kernels on the GPU, lineax_lm's chunked xla ops on
the CPU); its greedy tokens (prefill, then decode from the cache) equal fla's.

Every fixture of EXPECTED must be present: a missing folder fails its test (the fixtures are
committed with this file's branch), and a folder not listed fails test_fixture_set.
"""
import importlib.util
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import lineax_lm
from lineax_lm.models.generate import generate

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
REPO = pathlib.Path(__file__).parents[3]
EXPECTED = ("gla", "gla_hybrid", "gated_deltanet", "gated_deltanet_hybrid", "delta_net",
            "delta_net_hybrid", "hgrn", "hgrn_hybrid", "hgrn2", "hgrn2_hybrid", "retnet",
            "retnet_hybrid", "kda", "kda_hybrid", "linear_attn", "linear_attn_hybrid", "rwkv6",
            "rwkv6_hybrid", "transformer")
RTOL = 1e-4
MAKE = "benchmarks/make_fla_fixtures.py"


def test_fixture_set():
  spec = importlib.util.spec_from_file_location("make_fla_fixtures", REPO / MAKE)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)  # imports no torch until it runs
  assert sorted(script.fixtures()) == sorted(EXPECTED)
  present = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.exists() else []
  assert not set(present) - set(EXPECTED), f"fixtures not in EXPECTED: {set(present) - set(EXPECTED)}"


@pytest.mark.parametrize("name", EXPECTED)
def test_logits_and_greedy_tokens_match_fla(name):
  folder = FIXTURES / name
  assert (folder / "reference.safetensors").exists(), (
      f"fixture {name} is missing from {FIXTURES}: make the fixtures with fla on the GPU host "
      f"({MAKE}; its docstring gives the command) and commit them")
  ref = load_file(folder / "reference.safetensors")
  model = lineax_lm.from_pretrained(folder)
  logits = np.asarray(model(jnp.asarray(ref["input_ids"], jnp.int32)))
  want = ref["logits"]
  np.testing.assert_allclose(logits, want, rtol=RTOL, atol=RTOL * np.abs(want).max())
  prompt = ref["prompt_ids"]
  new = generate(model, prompt, ref["greedy_ids"].shape[1], temperature=0.0)[:, prompt.shape[1]:]
  np.testing.assert_array_equal(np.asarray(new), ref["greedy_ids"])
