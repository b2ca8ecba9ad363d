"""The distillation pipeline on the tiny runlocal teacher: every stage's loss falls, stages chain and
resume, the maturity curve, the evaluation and the study entry point (all students, one budget, one
table); the study's budget split, long documents, reference text and score recoveries; chat
rendering for the SFT stage."""
import json
import os
import types

import jax
import numpy as np
import pytest
from flax import nnx

from lineax_lm.data.tokenizer import ByteTokenizer
from lineax_lm.distill import chat, data as distill_data, pipeline, study
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
  config.curve.update(dict(every=8, needle_examples=2))  # scored: the e2e start and step 8
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
  # The maturity curve: the e2e start (stage 2's end) and every kept e2e checkpoint, by tokens.
  curve = summary["curve"]
  per_step = config.data.global_batch_size * config.data.seq_len
  assert [r["e2e_step"] for r in curve] == [0, 8]
  assert [r["tokens"] for r in curve] == [(10 + 8 + s) * per_step for s in (0, 8)]
  assert all(0 < r["recovery_teacher_samples"] and "niah_single@384" in r["needle"] for r in curve)
  assert os.path.exists(os.path.join(workdir, "curve.png"))
  assert summary["train_tokens_per_s"].keys() == set(pipeline.STAGES)

  # Stage 1 trains only the linear layer's mixer: everything else is still the teacher's.
  run = pipeline.Distillation(config, workdir)
  params = dict(nnx.to_flat_state(run.stage_params("layer")()))
  teacher = dict(nnx.to_flat_state(nnx.state(run.teacher, nnx.Param)))
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
def test_study_entry_one_budget_one_table_resumes(tmp_path, capsys):
  workdir = str(tmp_path / "study")
  # One hybrid student (one linear layer on the 2-layer tiny teacher: half the compile time), the
  # whole budget in the e2e stage (3 steps of 8 x 64 tokens; the pipeline test runs every stage).
  args = ["--workdir", workdir, "--runlocal", "--hybrid", "--students", "gated_deltanet,gla",
          "--tokens", "1536", "--shares", "0,0,1", "--curve_points", "0", "--needle_examples", "2",
          "--recall_examples", "4"]
  # Through --parallel: one --prepare process (teacher samples and scores), then the student in a
  # process of its own with its log in its folder; this process prints the table.
  summaries = study.main(args + ["--only", "gated_deltanet", "--parallel", "2"])
  table = capsys.readouterr().out
  assert "gated_deltanet: started" in table and "gated_deltanet: finished after" in table
  assert set(summaries) == {"gated_deltanet"}
  s = summaries["gated_deltanet"]
  run = os.path.join(workdir, "gated_deltanet")
  assert "this invocation" in open(os.path.join(run, "study.log")).read()
  assert os.path.exists(os.path.join(workdir, "data", "teacher_eval.json"))
  assert len(_losses(pipeline.stage_dir(run, "e2e"))) == 3
  assert not os.path.exists(pipeline.stage_dir(run, "layer"))
  for name in ("| teacher", "| gated_deltanet", "rec teacher_samples", "rec text", "single@384",
               "mqar 64/4", "rec needle", "rec recall", "fwd tok/s"):
    assert name in table, table
  assert s["final_stage"] == "e2e" and s["ppl_text"]["teacher"] > 0
  assert s["recall"]["student"].keys() == {"mqar@64/4"} and s["forward_tokens_per_s"]["student"] > 0
  assert s["train_tokens_per_s"]["e2e"] > 0
  # One student ran, alone on the device; students that shared it get their tok/s flagged.
  assert s["sharing"] == 1 and "shared the device" not in table
  assert "up to 4 students shared the device" in study.format_study({"gla": dict(s, sharing=4)})
  # Finished: a rerun reads its evaluation and trains nothing.
  again = study.main(args + ["--only", "gated_deltanet"])
  assert again["gated_deltanet"]["ppl_text"] == s["ppl_text"] and again["gated_deltanet"]["sharing"] == 1
  assert "this invocation" not in capsys.readouterr().out
  saved = json.load(open(os.path.join(workdir, "study.json")))
  assert saved["table"] in table and os.path.exists(os.path.join(workdir, "study.md"))
  assert set(study.main(args + ["--tables"])) == {"gated_deltanet"}
  with pytest.raises(SystemExit, match=r"^error: flags students=.*\['hgrn'\] are not study students"):
    study.main(args + ["--only", "hgrn"])


def test_study_bad_flags_give_one_line_naming_the_flag():
  for argv, message in ((["--workdir", "w", "--parallel", "0"], "flag --parallel=0: 0 is not"),
                        (["--parallel", "2"], "flag --workdir=None"),
                        (["--workdir", "w", "--only", "hgrn"], r"\['hgrn'\] are not study students"),
                        (["--workdir", "w", "--tokens", "lots"], "flag --tokens=lots")):
    with pytest.raises(SystemExit, match=f"^error: .*{message}") as e:
      study.main(argv)
    assert "\n" not in e.value.code


def test_study_budget_documents_reference_text_and_recoveries(tmp_path):
  steps = study.stage_steps(2e6, 4 * 2048)
  assert steps == {"layer": 49, "block": 49, "e2e": 146}
  assert study.stage_steps(2e6, 4 * 2048, {"layer": 0, "block": 1, "e2e": 3})["layer"] == 0
  with pytest.raises(ValueError, match="shares"):
    study.stage_steps(2e6, 8, {"layer": 1, "block": 1, "e2e": 0})
  c = study.study_config("mlstm_dense", 3e9)
  assert c.student.mixer == "mlstm" and c.student.mixer_cfg.qkv_proj == "dense"
  assert c.stages.e2e.steps == round(0.6 * 3e9 / (4 * 2048)) and c.samples.join_tokens == 2048
  assert tuple(c.eval.needle_lengths) == (256, 512, 1024, 2048) and c.curve.every > 0
  with pytest.raises(ValueError, match="tokens"):
    study.stage_steps(0, 8)
  tok = ByteTokenizer()
  docs = distill_data.join_documents(["a" * 30, "b" * 30, "c" * 30, "d" * 10], tok, 50)
  assert docs == ["a" * 30 + "\n\n" + "b" * 30]                     # the short remainder is dropped
  assert distill_data.join_documents(["x", "y"], tok, 0) == ["x", "y"]
  path = distill_data.write_reference_text(str(tmp_path), max_chars=1000)
  text = open(path).read()
  assert len(text) == 1000 and "statement" in text
  assert pipeline.score_recovery({"a": 0.5, "b": 1.0, "c": None}, {"a": 0.25, "b": 0.5, "c": 1.0}) == 0.5
  assert pipeline.score_recovery({"a": 0.0}, {"a": 1.0}) is None


def test_lm_eval_scores_teacher_and_student_through_the_adapter():
  """evaluate_models on a local two-choice task (lm-eval's simple_evaluate replaced by a tiny one
  that sends the adapter the requests a multiple-choice task would): both models scored alike."""
  from lineax_lm.distill.teacher import teacher_from_checkpoint, tiny_teacher
  from lineax_lm.eval.lm_eval_adapter import evaluate_models
  model, _ = teacher_from_checkpoint(tiny_teacher(), backend="reference")
  docs = [("The sky is", [" blue", " loud"], 0), ("Two plus two is", [" four", " xyzzy"], 0)]

  def simple_evaluate(model, tasks, limit, task_manager):
    assert tasks == ["local_choice"] and limit == 2 and task_manager is None
    reqs = [types.SimpleNamespace(args=(ctx, c)) for ctx, choices, _ in docs for c in choices]
    lls = [ll for ll, _ in model.loglikelihood(reqs)]
    acc = np.mean([np.argmax(lls[2 * i:2 * i + 2]) == gold for i, (_, _, gold) in enumerate(docs)])
    return {"results": {"local_choice": {"alias": "local_choice", "acc,none": acc,
                                         "acc_stderr,none": 0.0}}}

  out = evaluate_models({"teacher": model, "student": model}, ByteTokenizer(), "local_choice",
                        limit=2, max_length=64, batch_size=2, simple_evaluate=simple_evaluate)
  assert out["teacher"] == out["student"] and set(out["teacher"]["local_choice"]) == {
      "acc,none", "acc_stderr,none"}
  with pytest.raises(ValueError, match="tasks"):
    evaluate_models({"m": model}, ByteTokenizer(), "", simple_evaluate=simple_evaluate)
