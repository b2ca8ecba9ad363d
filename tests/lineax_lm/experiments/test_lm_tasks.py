"""The lm-eval six-task preset: its average from lm-eval's results, and local tasks (no lm-eval, no
download) scored through the lineax adapter with lm-eval's acc / acc_norm definitions."""
import json

import pytest

from lineax_lm.eval.lm_eval_adapter import LineaxLM
from lineax_lm.experiments import lm_tasks
from lineax_lm.models.hybrid import init_model
from tests.lineax_lm.tiny import tiny_config


def test_summary_averages_the_six_metrics():
  tasks = lm_tasks.preset_tasks("hybrid_six")
  assert [t for t, _, _ in tasks] == ["arc_challenge", "arc_easy", "hellaswag", "lambada_openai",
                                      "openbookqa", "piqa"]
  values = dict(zip([t for t, _, _ in tasks], (0.2, 0.5, 0.3, 0.4, 0.25, 0.65)))
  results = {"results": {t: {f"{m},none": values[t], f"{'acc' if m == 'acc_norm' else 'acc_norm'},none": 0.0,
                             "acc_stderr,none": 0.01} for t, _, m in tasks}}
  summary = lm_tasks.summarize(results, tasks)
  assert summary["average"] == pytest.approx(sum(values.values()) / 6) and not summary["missing"]
  del results["results"]["piqa"]
  summary = lm_tasks.summarize(results, tasks)
  assert summary["average"] is None and summary["missing"] == ["piqa"]
  assert "| average |" in lm_tasks.format_summary(summary)
  assert lm_tasks.preset_tasks("hybrid_six", {"piqa": "acc_norm"})[-1] == ("piqa", "PIQA", "acc_norm")
  with pytest.raises(ValueError, match="not tasks"):
    lm_tasks.preset_tasks("hybrid_six", {"mmlu": "acc"})


def test_local_tasks_through_the_adapter(tmp_path):
  lm = LineaxLM(model=init_model(tiny_config("transformer", vocab_size=259, num_layers=1), 0), tokenizer="byte", max_length=64,
                batch_size=4)
  arc = tmp_path / "arc_easy.jsonl"
  items = [{"context": "Question: what is hot?\nAnswer:", "choices": ["fire", "ice cold water"], "gold": 0},
           {"context": "Question: 1+1?\nAnswer:", "choices": ["2", "3", "eleven"], "gold": 2}]
  arc.write_text("".join(json.dumps(i) + "\n" for i in items))
  lamb = tmp_path / "lambada_openai.jsonl"
  lamb.write_text(json.dumps({"context": "the cat sat on the", "continuation": " mat"}) + "\n")
  summary = lm_tasks.evaluate_local(lm, [str(arc), str(lamb)])
  rows = {r["task"]: r for r in summary["rows"]}
  # acc / acc_norm recomputed from the adapter's log-likelihoods
  acc = acc_norm = 0.0
  for item in items:
    lls = [ll for ll, _ in lm.loglikelihood([lm_tasks._Request(item["context"], " " + c)
                                             for c in item["choices"]])]
    acc += max(range(len(lls)), key=lls.__getitem__) == item["gold"]
    norm = [ll / len(c) for ll, c in zip(lls, item["choices"])]
    acc_norm += max(range(len(lls)), key=norm.__getitem__) == item["gold"]
  assert rows["arc_easy"]["value"] == acc / 2
  greedy = lm.loglikelihood([lm_tasks._Request("the cat sat on the", " mat")])[0][1]
  assert rows["lambada_openai"]["value"] == float(greedy)
  assert summary["missing"] == ["arc_challenge", "hellaswag", "openbookqa", "piqa"]
  assert summary["average"] is None
  per_task = lm_tasks.evaluate_local_task(lm, str(arc))
  assert per_task["acc_norm,none"] == acc_norm / 2 and per_task["samples"] == 2
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question": "?"}) + "\n")
  with pytest.raises(ValueError, match="context"):
    lm_tasks.read_local_task(str(bad))


@pytest.mark.parametrize("argv,message", [
    ([], "give one model: --workdir or --teacher"),
    (["--workdir", "w", "--teacher"], "give one model"),
    (["--teacher", "--metric", "piqa"], "flag --metric=\\['piqa'\\]: takes TASK=METRIC"),
    (["--teacher", "--local", "missing/*.jsonl"], "--local: .* matches no file"),
])
def test_bad_flags_give_one_line(argv, message):
  with pytest.raises(SystemExit, match=f"^error: .*{message}") as e:
    lm_tasks.main(argv)
  assert "\n" not in e.value.code
