"""Student initialisation from the teacher, for the seven mixers of the study and their hybrids."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lineax_lm.distill.student import init_student, linear_layers, repeat_kv, student_config
from lineax_lm.distill.config import STUDENTS
from lineax_lm.distill.teacher import teacher_from_checkpoint, tiny_teacher

STUDY_MIXERS = tuple(dict.fromkeys(mixer for mixer, _ in STUDENTS.values()))


@pytest.fixture(scope="module")
def teacher():
  model, cfg = teacher_from_checkpoint(tiny_teacher(), backend="xla")
  return model, cfg


def _w(module):  # nnx kernel [in, out] -> HF [out, in]
  return np.asarray(module.kernel[...]).T


def test_repeat_kv_is_hf_repeat_kv():
  w = np.arange(2 * 3 * 5).reshape(2 * 3, 5)       # 2 kv heads of dim 3, hidden 5
  full = repeat_kv(w, 2, 6).reshape(6, 3, 5)       # 6 query heads: kv head j serves 3j .. 3j + 2
  for h in range(6):
    np.testing.assert_array_equal(full[h], w.reshape(2, 3, 5)[h // 3])


@pytest.mark.parametrize("ratio", ["pure", "1:1"])
@pytest.mark.parametrize("mixer", STUDY_MIXERS)
def test_student_init_copies_the_teacher(teacher, mixer, ratio):
  t, tcfg = teacher
  scfg = student_config(tcfg, mixer, attn_ratio=ratio)
  s = init_student(t, scfg, seed=1)
  flat_t = dict(nnx.to_flat_state(nnx.state(t, nnx.Param)))
  for path, var in nnx.to_flat_state(nnx.state(s, nnx.Param)):
    if path[0] != "blocks" or path[2] != "mixer" or s.blocks[path[1]].is_attention:
      np.testing.assert_array_equal(np.asarray(var[...]), np.asarray(flat_t[path][...]), str(path))
  assert linear_layers(scfg) == ((0, 1) if ratio == "pure" else (0,))
  H, Hkv = tcfg.heads, tcfg.kv_heads
  for i in linear_layers(scfg):
    tm, sm = t.blocks[i].mixer, s.blocks[i].mixer
    q, k, v, o = (_w(getattr(tm, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    k, v = repeat_kv(k, Hkv, H), repeat_kv(v, Hkv, H)
    if mixer == "mlstm":
      np.testing.assert_array_equal(_w(sm.proj_up)[:sm.inner], v)
      np.testing.assert_array_equal(_w(sm.proj_down), o)
      blocks = np.asarray(sm.v_proj.weight[...])
      np.testing.assert_array_equal(blocks, np.broadcast_to(np.eye(blocks.shape[1]), blocks.shape))
    else:
      for name, want in (("q_proj", q), ("k_proj", k), ("v_proj", v), ("o_proj", o)):
        np.testing.assert_array_equal(_w(getattr(sm, name)), want, name)
    for name in getattr(sm, "conv_names", ()):
      w = np.asarray(getattr(sm, f"{name}_conv1d").weight[...])
      np.testing.assert_array_equal(w, np.eye(w.shape[0])[-1][:, None] * np.ones_like(w))


def test_dense_mlstm_student_inherits_q_k_v_o(teacher):
  t, tcfg = teacher
  s = init_student(t, student_config(tcfg, "mlstm", mixer_cfg={"qkv_proj": "dense"}))
  H, Hkv = tcfg.heads, tcfg.kv_heads
  for i in (0, 1):
    tm, sm = t.blocks[i].mixer, s.blocks[i].mixer
    for name in ("q_proj", "k_proj", "v_proj"):
      want = _w(getattr(tm, name))
      want = want if name == "q_proj" else repeat_kv(want, Hkv, H)
      np.testing.assert_array_equal(_w(getattr(sm, name)), want, name)
    np.testing.assert_array_equal(_w(sm.proj_down), _w(tm.o_proj))


def test_all_attention_student_is_the_teacher(teacher):
  t, tcfg = teacher
  s = init_student(t, student_config(tcfg, "gla", attn_ratio="transformer"))
  x = jnp.asarray(np.random.default_rng(1).integers(0, 259, (2, 20)))
  np.testing.assert_array_equal(np.asarray(s(x)), np.asarray(t(x)))


@pytest.mark.parametrize("mixer", ["deltanet", "linear_attn"])
def test_ungated_output_norm_starts_at_zero_output(teacher, mixer):
  """DeltaNet and linear attention scale each head to unit RMS with no gate after it: with fla's
  weight-1 norm the student starts stage 1 worse than a zero output (the study's DeltaNet student
  ended stage 1 at 1.92); from weight 0 it starts at exactly the zero output's loss 1."""
  from lineax_lm.distill.losses import alignment_loss
  t, tcfg = teacher
  inputs = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, 24)))
  batch = {"inputs": inputs, "loss_mask": jnp.ones(inputs.shape)}

  def layer_loss(student):
    total, (_, count) = alignment_loss(student, t, batch, layers=(0, 1), level="layer")
    return float(total / count)
  cfg = student_config(tcfg, mixer)
  assert layer_loss(init_student(t, cfg)) == pytest.approx(1.0, abs=1e-6)
  assert layer_loss(init_student(t, cfg, output_norm_init="ones")) > 1.01
  gated = init_student(t, student_config(tcfg, "gated_deltanet"))
  np.testing.assert_array_equal(gated.blocks[0].mixer.o_norm.weight[...], 1.0)


def test_student_errors(teacher):
  t, tcfg = teacher
  with pytest.raises(ValueError, match="mixer: 'hgrn' has no teacher mapping"):
    student_config(tcfg, "hgrn")
  with pytest.raises(ValueError, match="config.hidden"):
    init_student(t, student_config(tcfg, "gla").replace(hidden=64))
  with pytest.raises(ValueError, match="mixer_cfg: the gated_deltanet student's q_proj"):
    init_student(t, student_config(tcfg, "gated_deltanet", mixer_cfg={"head_dim": 16}))
  with pytest.raises(ValueError, match="conv_init"):
    init_student(t, student_config(tcfg, "gla"), conv_init="zeros")
  with pytest.raises(ValueError, match="output_norm_init"):
    init_student(t, student_config(tcfg, "deltanet"), output_norm_init="random")


def test_dense_mlstm_layer_decodes_as_it_trains():
  """The dense-q/k/v mLSTM (the mlstm_dense student's layer): one-token decode steps give the
  full-sequence forward's outputs (the gradient is exercised by the pipeline test's training)."""
  from lineax_lm.layers import LayerSpec, build_mixer, mixer_config
  cfg = mixer_config("mlstm", num_heads=2, proj_factor=1.0, round_to=8, qkv_proj="dense",
                     backend="reference")
  layer = build_mixer("mlstm", cfg, LayerSpec(16, init_std=0.3), nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 9, 16)), jnp.float32)
  graphdef, state = nnx.split(layer)
  run = jax.jit(lambda state, x, cache: nnx.merge(graphdef, state)(x, cache))
  full, _ = run(state, x, None)
  cache, steps = layer.init_cache(2, 9), []
  for t in range(9):
    y, cache = run(state, x[:, t:t + 1], cache)
    steps.append(y)
  np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=2e-4, atol=2e-5)
  with pytest.raises(ValueError, match="qkv_proj"):
    build_mixer("mlstm", mixer_config("mlstm", num_heads=2, qkv_proj="full"), LayerSpec(16),
                nnx.Rngs(0))
