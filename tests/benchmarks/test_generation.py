"""benchmarks/generation.py's rules: the new prompt lengths it times fall where lineax_lm's buckets
say they should, its table gives each row's ratios to fla's and HF Llama's row of its batch, and
--profile writes its table."""
import jax
import numpy as np
import pytest
from flax import nnx

from lineax_lm.models.generate import length_bucket
from lineax_lm.models.hybrid import HybridLM
from tests.lineax_lm.tiny import tiny_config


@pytest.fixture
def generation(import_benchmark):
  return import_benchmark("generation")


@pytest.mark.parametrize("prompt", [32, 2048])
def test_new_lengths_run_the_prompts_program(generation, prompt):
  first, second = generation.new_lengths(prompt)
  assert first < second < prompt  # lengths the warm-up did not see
  # one compiled program per length bucket: the one the warm-up compiled
  assert length_bucket(first) == length_bucket(second) == length_bucket(prompt)


def test_table_ratios_are_to_the_rows_of_the_same_batch(generation):
  def row(model, batch, prefill_s, tokens_per_s, **more):
    return dict(model=model, batch=batch, params_M=475.0, prefill_s=prefill_s, ttft_s=prefill_s,
                generate_s=1.0, decode_tokens_per_s=tokens_per_s, step_ms=4.0, first_call_s=20.0,
                peak_GiB=3.0, **more)

  rows = [row("gated_deltanet_340m_fla", 1, 0.010, 300.0, compile_s=19.0),
          row("gated_deltanet_340m_fla", 64, 0.400, 9000.0),
          dict(model="gated_deltanet_340m_fla:3:1", batch=1, error="RuntimeError: out of memory"),
          row("fla_gated_deltanet_340m", 1, 0.020, 100.0),
          row("fla_gated_deltanet_340m", 64, 0.600, 3000.0),
          row("hf_llama_sdpa", 64, 0.300, 4500.0)]
  meta = dict(date="2026-12-05 00:00 UTC", device="NVIDIA H200 x 1", jax="0.11.2", torch="2.11",
              fla="0.6.0", torch_device="NVIDIA H200", commit="abc1234", command="c", prompt=2048,
              new_tokens=256, dtype="bfloat16")
  lines = generation.table(rows, meta).splitlines()
  ours_1, ours_64, hybrid_1 = (lines[i].split(" | ") for i in (7, 8, 9))
  # prefill: fla's time over ours; decode: our tokens/s over theirs; no Llama row at B=1
  assert ours_1[3:7] == ["2.00x", "300", "3.00x", "-"]
  assert ours_1[9] == "20.00 (19.0)"
  assert ours_64[3:7] == ["1.50x", "9000", "3.00x", "2.00x"]
  assert hybrid_1[2].startswith("error: RuntimeError: out of memory")
  assert "torch 2.11, fla 0.6.0 (NVIDIA H200)" in lines[0]


def test_the_prefill_profile_is_written(generation, tmp_path):
  """--profile's traces of compiled prefills land as one file, a section per form (on a CPU: the
  line that says the trace holds no device events); the two step forms it compares compute the
  same logits and final states."""
  model = HybridLM(tiny_config(vocab_size=64), nnx.Rngs(0))
  path = tmp_path / "prefill_profile.md"
  ids = np.random.default_rng(0).integers(0, 64, (2, 16), dtype=np.int32)
  generation.profile_prefill(model, ids, 1, str(path))
  text = path.read_text()
  assert text.startswith("# prefill of 2 x 16 tokens, 1 calls a form\n")
  for form in ("generate(max_new_tokens=1)", "prefill step, prompt length traced",
               "prefill step, whole width"):
    assert f"## {form}: " in text
  traced, whole = (generation._prefill_step(model, ids, n) for n in (np.int32(16), None))
  np.testing.assert_allclose(traced[0], whole[0], rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(traced[1]), jax.tree.leaves(whole[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
