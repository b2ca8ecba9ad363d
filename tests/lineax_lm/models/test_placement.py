"""The periodic placement of attention layers, and the errors of a ratio or layer list that names
none."""
import pytest

from lineax_lm.models.config import ModelConfig
from lineax_lm.models.placement import attention_layers


def test_attention_placement():
  assert attention_layers(24, "3:1") == tuple(range(3, 24, 4))
  assert attention_layers(24, "6:1") == (6, 13, 20)
  with pytest.warns(UserWarning, match=r"places 1 attention layer\(s\) \[12\] \(effective 23:1\)"):
    assert attention_layers(24, "12:1") == (12,)  # one layer where the ratio asks for two
  assert attention_layers(24, "24:1") == (23,)  # fewer than r + 1 layers: the last one
  assert attention_layers(24, "pure") == ()
  assert attention_layers(5, "transformer") == attention_layers(5, "attention") == (0, 1, 2, 3, 4)
  assert attention_layers(24, "3:1", [0, 5]) == (0, 5)
  for bad in ("3:2", "x:1", "0:1", "half"):
    with pytest.raises(ValueError, match="attn_ratio"):
      attention_layers(24, bad)
  with pytest.raises(ValueError, match="attn_layers"):
    ModelConfig(num_layers=4, attn_layers=(4,))
