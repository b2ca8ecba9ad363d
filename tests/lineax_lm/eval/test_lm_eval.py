"""`python -m lineax_lm.eval.lm_eval`: lm-eval's own command line runs a local multiple-choice task
(a YAML and a JSONL file, no download) on a saved tiny model through `--model lineax`, and writes
lm-eval's results with the accuracy the adapter's log-likelihoods give."""
import glob
import json

import pytest
from flax import nnx

import lineax_lm
from lineax_lm.data.tokenizer import ByteTokenizer
from lineax_lm.eval.lm_eval_adapter import LineaxLM
from lineax_lm.experiments import lm_tasks
from lineax_lm.models.hybrid import HybridLM
from tests.lineax_lm.tiny import tiny_config

ITEMS = [{"context": "Question: what is hot?\nAnswer:", "choices": ["fire", "ice"], "gold": 0},
         {"context": "Question: 1+1?\nAnswer:", "choices": ["2", "3", "eleven"], "gold": 2}]

TASK = """task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
"""


@pytest.mark.slow
def test_lm_eval_cli_runs_a_local_task_on_a_saved_model(tmp_path, monkeypatch):
  pytest.importorskip("lm_eval", reason="optional: the lm-eval extra (pip install 'lineax-lm[eval]')")
  from lineax_lm.eval import lm_eval
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
  tok = ByteTokenizer()
  model = HybridLM(tiny_config("gated_deltanet", vocab_size=tok.vocab_size, num_layers=1), nnx.Rngs(0))
  path = lineax_lm.save_pretrained(model, tmp_path / "model", tokenizer=tok)
  data = tmp_path / "tasks" / "tiny_choice.jsonl"
  data.parent.mkdir()
  data.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
  (tmp_path / "tasks" / "tiny_choice.yaml").write_text(TASK.format(data=data))
  lm_eval.main(["--model", "lineax", "--model_args", f"path={path},max_length=64",
                "--tasks", "tiny_choice", "--include_path", str(tmp_path / "tasks"),
                "--batch_size", "2", "--output_path", str(tmp_path / "out")])
  (results,) = glob.glob(str(tmp_path / "out" / "**" / "results_*.json"), recursive=True)
  acc = json.load(open(results))["results"]["tiny_choice"]["acc,none"]
  # The same items scored by the adapter directly: the choice of highest log-likelihood.
  lm = LineaxLM(model=model, tokenizer=tok, max_length=64)
  right = 0
  for item in ITEMS:
    lls = [ll for ll, _ in lm.loglikelihood([lm_tasks._Request(item["context"], " " + c)
                                             for c in item["choices"]])]
    right += max(range(len(lls)), key=lls.__getitem__) == item["gold"]
  assert acc == pytest.approx(right / len(ITEMS))
  with pytest.raises(SystemExit, match=f"^error: {tmp_path}/none holds neither config.json"):
    lm_eval.main(["--model", "lineax", "--model_args", f"path={tmp_path}/none", "--tasks", "tiny_choice",
                  "--include_path", str(tmp_path / "tasks")])


def test_path_and_workdir_name_one_model():
  with pytest.raises(ValueError, match="`path`='a' and `workdir`='b' name two models"):
    LineaxLM(path="a", workdir="b")
  with pytest.raises(ValueError, match="needs `path`"):
    LineaxLM()
