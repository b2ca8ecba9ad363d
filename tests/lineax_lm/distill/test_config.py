"""configs/distill.py takes the student as its argument, then switches; a name it does not know
is refused naming the choices."""
import os

import pytest

from lineax_lm.distill.config import STUDENTS
from lineax_lm.train.__main__ import load_config_file

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")


def distill(arg=None):
  path = os.path.join(CONFIGS, "distill.py")
  return load_config_file(path if arg is None else f"{path}:{arg}")


def test_the_argument_names_the_student_then_switches():
  assert distill().student.mixer == distill("gated_deltanet").student.mixer == "gated_deltanet"
  for student, (mixer, mixer_cfg) in STUDENTS.items():
    c = distill(student)
    assert c.student.mixer == mixer and c.student.mixer_cfg.to_dict() == mixer_cfg
    assert c.student.attn_ratio == "pure" and not c.teacher.tiny
  hybrid = distill("gla,hybrid")
  assert hybrid.student.mixer == "gla" and hybrid.student.attn_ratio == "3:1"
  local = distill("kda,hybrid,runlocal")
  assert local.teacher.tiny and local.student.attn_ratio == "1:1"   # the tiny teacher's 2 layers


def test_the_study_config_takes_the_same_argument():
  c = load_config_file(os.path.join(CONFIGS, "distill_study.py") + ":mlstm_dense,runlocal")
  assert c.student.mixer == "mlstm" and c.student.mixer_cfg.qkv_proj == "dense" and c.teacher.tiny


@pytest.mark.parametrize("arg,message", [("hgrn", r"student: 'hgrn' is not a student; choose from"),
                                         ("gla,hybird", r"unknown switch\(es\) \['hybird'\]")])
def test_a_name_it_does_not_know_is_refused(arg, message):
  with pytest.raises(ValueError, match=message):
    distill(arg)
  with pytest.raises(ValueError, match=message):
    load_config_file(os.path.join(CONFIGS, "distill_study.py") + f":{arg}")
