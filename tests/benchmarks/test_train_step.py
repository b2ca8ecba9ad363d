"""benchmarks/train_step.py's preset entries: "name[:ratio][@segments][#variant]" read into their
parts, a bad variant refused with one line naming it, and every entry a file name a device call
brings back."""
import pytest


@pytest.fixture
def train_step(import_benchmark):
  return import_benchmark("train_step")


@pytest.mark.parametrize("entry,parts", [
    ("gated_deltanet_340m_fla", ("gated_deltanet_340m_fla", "", "", "")),
    ("gated_deltanet_340m_fla:3:1@auto", ("gated_deltanet_340m_fla", "3:1", "auto", "")),
    ("gated_deltanet_340m_fla#keep_states=1+keep_wu=1",
     ("gated_deltanet_340m_fla", "", "", "keep_states=1+keep_wu=1")),
])
def test_a_preset_entry_names_its_parts(train_step, entry, parts):
  assert tuple(train_step.parse_spec(entry)) == parts
  assert train_step.spec_file_name(entry).replace("_", "").replace(".", "").replace("-", "").isalnum()


def test_a_bad_variant_is_refused_naming_it(train_step):
  with pytest.raises(SystemExit) as exit_:
    train_step.parse_args(["--presets", "gated_deltanet_340m_fla#keep_all=1"])
  assert str(exit_.value.code).startswith("error: --presets: VARIANTS: 'keep_all=1'")
