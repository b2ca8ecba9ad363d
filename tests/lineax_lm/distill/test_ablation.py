"""The DeltaNet-student ablation (lineax_lm.distill.ablation) on the tiny runlocal teacher: Gated
DeltaNet without its decay is DeltaNet with the output gate, and the command runs end to end."""
import json
import math

import jax
import numpy as np
import pytest

from lineax_lm.distill import ablation
from lineax_lm.distill.teacher import teacher_from_checkpoint, tiny_teacher


def test_gated_deltanet_without_decay_is_deltanet_with_output_gate():
  teacher, cfg = teacher_from_checkpoint(tiny_teacher(), backend="reference")
  gdn = ablation.variant_mixers(teacher, cfg, "gated_deltanet_no_decay", [0], seed=0)[0]
  dn = ablation.variant_mixers(teacher, cfg, "deltanet_gate", [0], seed=1)[0]
  # The teacher gives both the same q/k/v/o and convolutions; the fresh b_proj / g_proj differ.
  assert not np.allclose(dn.b_proj.kernel[...], gdn.b_proj.kernel[...])
  for name in ("b_proj", "g_proj"):
    getattr(dn, name).kernel[...] = getattr(gdn, name).kernel[...]
  x = jax.random.normal(jax.random.key(0), (2, 24, cfg.hidden))
  np.testing.assert_allclose(dn(x)[0], gdn(x)[0], rtol=1e-5, atol=1e-6)
  with_decay = ablation.variant_mixers(teacher, cfg, "gated_deltanet", [0], seed=0)[0]
  assert not np.allclose(with_decay(x)[0], gdn(x)[0], atol=1e-4)


def test_ablation_command(tmp_path, capsys):
  out = tmp_path / "ablation.json"
  results = ablation.main(["--runlocal", "--layers=1", "--variants=deltanet,gated_deltanet_no_decay",
                           "--steps=2", "--train_rows=4", "--eval_rows=2", "--seq_len=32",
                           f"--out={out}"])
  printed = capsys.readouterr().out
  assert "| deltanet | " in printed and "| gated_deltanet_no_decay | " in printed
  assert json.loads(out.read_text()) == {v: {"1": list(r[1])} for v, r in results.items()}
  for per_layer in results.values():
    before, after = per_layer[1]
    assert math.isfinite(before) and math.isfinite(after) and after != before


@pytest.mark.parametrize("args, message", [
    (["--variants=deltanet,mamba"], "--variants: unknown ['mamba']"),
    (["--layers=2"], "--layers: [2] outside the teacher's 2 layers"),
])
def test_ablation_bad_flags(args, message):
  with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
    ablation.main(["--runlocal", "--train_rows=2", "--eval_rows=2", "--seq_len=32", *args])
