"""The distillation pipeline on the tiny runlocal teacher: every stage's loss falls, stages chain and
resume, the evaluation and the comparison entry point; chat rendering for the SFT stage."""
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from lineax_lm.data.tokenizer import ByteTokenizer
from lineax_lm.distill import chat, compare, pipeline
from lineax_lm.distill.config import distill_config

# SmolLM2-135M-Instruct's GGUF chat template (tokenizer.chat_template), verbatim.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")
CONV = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["loss"] for line in f if '"loss"' in line]


def test_chatml_matches_smollm2_template():
  system = chat.chatml_system(SMOLLM2_TEMPLATE)
  assert system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
  text = "".join(t for t, _ in chat.render_chat(CONV, system, add_generation_prompt=True))
  assert text == ("<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>assistant\n")
  with_system = [{"role": "system", "content": "Be brief."}] + CONV
  assert chat.render_chat(with_system, system)[0] == ("<|im_start|>system\n", False)
  with pytest.raises(ValueError, match="ChatML"):
    chat.chatml_system("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}{% endfor %}")
  with pytest.raises(ValueError, match="role"):
    chat.render_chat([{"content": "x"}])


def test_chatml_matches_jinja_rendering():
  """Optional: our renderer against the template evaluated by jinja2 (not a dependency)."""
  jinja2 = pytest.importorskip("jinja2", reason="optional: jinja2 renders the GGUF template itself")
  want = jinja2.Template(SMOLLM2_TEMPLATE).render(messages=CONV, add_generation_prompt=False)
  system = chat.chatml_system(SMOLLM2_TEMPLATE)
  assert "".join(t for t, _ in chat.render_chat(CONV, system)) == want


def test_chat_loss_mask_covers_assistant_tokens_only(tmp_path):
  tok = ByteTokenizer()
  ids, mask = chat.tokenize_chat(tok, CONV, "S")
  assert tok.decode(ids[mask == 1].tolist()) == "Hello!<|im_end|>4<|im_end|>"
  path = tmp_path / "chat.jsonl"
  path.write_text("\n".join(json.dumps({"messages": CONV[:2 + i % 3]}) for i in range(6)))
  cfg = distill_config("gla", "runlocal").data
  cfg.update(dict(paths=str(path), text_field="messages", tokenizer="byte", seq_len=128,
                  global_batch_size=2))
  it = chat.chat_dataset(cfg, seed=0, default_system="S")
  batch = next(it)
  state = it.get_state()
  assert {k: v.shape for k, v in batch.items()} == {k: (2, 128) for k in ("inputs", "targets",
                                                                           "loss_mask")}
  for row, m in zip(batch["targets"], batch["loss_mask"]):
    assert tok.decode(row[m == 1].tolist()).startswith("Hello!<|im_end|>")
  nxt = next(it)
  it2 = chat.chat_dataset(cfg, seed=0, default_system="S")
  it2.set_state(state)
  np.testing.assert_array_equal(next(it2)["inputs"], nxt["inputs"])


@pytest.mark.slow
def test_runlocal_pipeline_every_stage_learns_and_resumes(tmp_path):
  workdir = str(tmp_path / "run")
  chat_path = tmp_path / "chat.jsonl"
  chat_path.write_text("\n".join(json.dumps({"messages": CONV}) for _ in range(8)))
  config = distill_config("gated_deltanet", "hybrid,runlocal")
  config.stages.sft.update(dict(steps=4, paths=str(chat_path), lr=3e-3))
  config.eval.needle_examples = 0
  summary = pipeline.distill(config, workdir)

  for stage in pipeline.STAGES:
    losses = _losses(pipeline.stage_dir(workdir, stage))
    assert len(losses) == config.stages[stage].steps, stage
    assert np.mean(losses[-2:]) < np.mean(losses[:2]), (stage, losses)
  assert summary["final_stage"] == "sft" and summary["attn_ratio"] == "1:1"
  ppl = summary["ppl_teacher_samples"]
  assert np.isfinite([ppl["teacher"], ppl["student"]]).all()
  assert summary["recovery_teacher_samples"] == pytest.approx(ppl["teacher"] / ppl["student"])
  assert json.load(open(os.path.join(workdir, "eval.json")))["final_stage"] == "sft"

  # Stage 1 trains only the linear layer's mixer: everything else is still the teacher's.
  st = pipeline.setup(config, workdir)
  params = dict(nnx.to_flat_state(pipeline.stage_params(config, "layer", st, workdir)()))
  teacher = dict(nnx.to_flat_state(nnx.state(st.teacher, nnx.Param)))
  moved = {p for p in params if not np.array_equal(np.asarray(jax.device_get(params[p][...])),
                                                   np.asarray(teacher[p][...]) if p in teacher
                                                   else np.nan)}
  assert moved and all(p[:3] == ("blocks", 0, "mixer") for p in moved)
  for p, var in teacher.items():  # layer 1 is attention: exactly the teacher's
    if p[0] != "blocks" or p[1] == 1:
      np.testing.assert_array_equal(np.asarray(jax.device_get(params[p][...])), np.asarray(var[...]))

  # Rerunning skips the finished stages and reuses the samples.
  sizes = {s: len(_losses(pipeline.stage_dir(workdir, s))) for s in pipeline.STAGES}
  pipeline.distill(config, workdir)
  assert {s: len(_losses(pipeline.stage_dir(workdir, s))) for s in pipeline.STAGES} == sizes


@pytest.mark.slow
def test_compare_entry_prints_both_students(tmp_path, capsys):
  workdir = str(tmp_path / "cmp")
  # Hybrid students (one linear layer each on the 2-layer tiny teacher) compile in half the time.
  summaries = compare.main(["--workdir", workdir, "--runlocal", "--hybrid", "--mixers",
                            "gated_deltanet,gla", "--steps", "0,0,3"])
  table = capsys.readouterr().out
  assert set(summaries) == {"gated_deltanet (1:1)", "gla (1:1)"}
  for name in ("| teacher", "| gated_deltanet (1:1)", "| gla (1:1)", "recovery teacher_samples",
               "needle niah_single@384"):
    assert name in table, table
  teacher_needle = summaries["gla (1:1)"]["needle"]["teacher"]
  for s in summaries.values():
    assert s["final_stage"] == "e2e" and s["needle"]["teacher"] == teacher_needle
  saved = json.load(open(os.path.join(workdir, "compare.json")))
  assert saved["table"] in table
  assert os.path.exists(os.path.join(workdir, "data", "teacher_eval.json"))
