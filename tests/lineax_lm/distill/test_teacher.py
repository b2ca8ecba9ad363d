"""The teacher as an NNX Llama: the shipped SmolLM2 against transformers' numbers, the tiny teacher."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

from lineax_lm.data.tokenizer import load_tokenizer
from lineax_lm.distill import checkpoints
from lineax_lm.distill.chat import chatml_system, tokenize_chat
from lineax_lm.distill.data import write_tokenizer
from lineax_lm.distill.teacher import (hf_to_nnx, save_safetensors_dir, teacher_from_checkpoint,
                                       tiny_teacher, with_values)
from lineax_lm.eval import ruler

PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"
# Hugging Face transformers 5.24 (torch, CPU, float32) on the same GGUF file: last-position logits.
TRANSFORMERS_LAST = {7042: 17.371261596679688, 0: 1.6136468648910522, 504: 6.22734260559082}


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint):
  ckpt = smollm2_checkpoint
  model, cfg = teacher_from_checkpoint(ckpt, backend="xla")
  logits = np.asarray(model(jnp.asarray([PROMPT])))[0]
  return ckpt, model, cfg, logits


@pytest.mark.slow  # loads the real 135M teacher
def test_smollm2_logits_match_transformers(smollm2):
  _, _, cfg, logits = smollm2
  assert (cfg.num_layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.mlp_hidden) == (
      30, 576, 9, 3, 64, 1536)
  assert cfg.tie_embeddings and cfg.rope_theta == 100000.0 and cfg.norm_eps == 1e-5
  assert int(np.argmax(logits[-1])) == 7042  # " Paris"
  for token, want in TRANSFORMERS_LAST.items():
    assert abs(logits[-1, token] - want) < 1e-3, (token, logits[-1, token], want)


@pytest.mark.slow  # loads the real 135M teacher
def test_smollm2_greedy_generation(smollm2):
  ckpt, model, _, _ = smollm2
  out = np.asarray(model.generate(jnp.asarray([PROMPT]), 2, temperature=0.0))[0]
  assert ckpt.tokenizer.decode(out[len(PROMPT):].tolist()) == " Paris."


@pytest.mark.slow
def test_smollm2_finds_the_needle(smollm2):
  """The distillation's needle metric on the teacher: SmolLM2 answers "are: 4033451", and the
  teacher-forced scoring gives it the separator (it scored 0.0 when the space was scored)."""
  ckpt, model, _, _ = smollm2
  rows = ruler.evaluate_tasks(model, ckpt.tokenizer, "niah_single", lengths=(256,), num_examples=4,
                              mode="teacher_forced", batch_size=4)
  assert rows[0]["accuracy"] == 1.0


@pytest.mark.slow  # loads the real 135M teacher
def test_smollm2_tokenizer_for_the_data_stack_and_chat(smollm2, tmp_path):
  ckpt = smollm2[0]
  tok = load_tokenizer(write_tokenizer(ckpt.tokenizer, str(tmp_path)))
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 0, 0)  # <|endoftext|> separates documents
  assert tok.encode("The capital of France is") == PROMPT
  system = chatml_system(ckpt.tokenizer.chat_template)
  assert system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
  ids, mask = tokenize_chat(tok, [{"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Hello there"}], system)
  assert ids[0] == 1 and list(ids).count(2) == 3  # <|im_start|>, three <|im_end|>
  assert tok.hf.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == "Hello there<|im_end|>"


@pytest.mark.slow  # loads the real 135M teacher
def test_smollm2_full_logits_match_transformers(smollm2):
  """Optional: every logit of every position against transformers loading the same GGUF."""
  torch = pytest.importorskip("torch", reason="optional parity test: needs torch + transformers")
  transformers = pytest.importorskip("transformers", reason="optional parity test: needs "
                                     "transformers (with gguf) beside torch")
  path = checkpoints.smollm2_gguf_path()
  ref = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32)
  with torch.no_grad():
    want = ref(torch.tensor([PROMPT])).logits[0].float().numpy()
  assert np.max(np.abs(smollm2[3] - want)) < 1e-3  # measured: 1.7e-4


def test_name_map_and_errors(tmp_path):
  assert hf_to_nnx("model.layers.3.self_attn.k_proj.weight") == (
      ("blocks", 3, "mixer", "k_proj", "kernel"), True)
  assert hf_to_nnx("model.layers.0.post_attention_layernorm.weight") == (
      ("blocks", 0, "mlp_norm", "weight"), False)
  assert hf_to_nnx("lm_head.weight") == (("lm_head",), True)
  with pytest.raises(ValueError, match="rotary"):
    hf_to_nnx("model.layers.0.self_attn.rotary_emb.inv_freq")
  ckpt = tiny_teacher(tie_word_embeddings=False)
  model, cfg = teacher_from_checkpoint(ckpt, backend="xla")
  assert not cfg.tie_embeddings
  np.testing.assert_array_equal(np.asarray(model.lm_head[...]), ckpt.params["lm_head.weight"].T)
  np.testing.assert_array_equal(np.asarray(model.blocks[1].mixer.k_proj.kernel[...]),
                                ckpt.params["model.layers.1.self_attn.k_proj.weight"].T)
  with pytest.raises(ValueError, match="values: no parameter"):
    with_values(model, {("blocks", 0, "nothing"): np.zeros(3)})
  with pytest.raises(ValueError, match="blocks.0.attn_norm.weight"):
    with_values(model, {("blocks", 0, "attn_norm", "weight"): np.zeros(3)})
  del ckpt.params["model.norm.weight"]
  with pytest.raises(ValueError, match="model.norm.weight"):
    teacher_from_checkpoint(ckpt)


def test_tiny_teacher_round_trips_through_safetensors(tmp_path):
  ckpt = tiny_teacher(seed=3)
  loaded = checkpoints.load_teacher(save_safetensors_dir(ckpt, str(tmp_path / "t")))
  assert loaded.config["head_dim"] == 8 and loaded.tokenizer is None
  a, _ = teacher_from_checkpoint(ckpt, backend="xla")
  b, _ = teacher_from_checkpoint(loaded, backend="xla")
  x = jnp.asarray(np.random.default_rng(0).integers(0, 259, (2, 12)))
  np.testing.assert_array_equal(np.asarray(a(x)), np.asarray(b(x)))
