"""The Pallas GPU kernels (Triton lowering: gated delta rule, delta rule, simple GLA) against the
float32 reference, through the same harness as the xla path: interpret mode on CPU (a few small
shapes: each case compiles its kernels, ~5 s of CPU each), and the whole matrix on a real GPU
(marker `gpu`), bf16 at T = 4096 too."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.gated_delta_rule import gpu as gdn_gpu
from tests.pallas_kernels import harness
from tests.pallas_kernels.test_delta_rule import CASE as DELTA
from tests.pallas_kernels.test_gated_delta_rule import CASE as GDN
from tests.pallas_kernels.test_simple_gla import BOTH as SGLA, G_ONLY as SGLA_G

# (T, H, K, V, dtype, varlen): odd T, K = 100 (padded to 128), V = 64, both dtypes, packed varlen.
INTERPRET_CASES = [
    (65, 1, 100, 64, "bfloat16", False),
    (150, 1, 16, 32, "float32", True),
]


@pytest.mark.parametrize("T,H,K,V,dtype,varlen", INTERPRET_CASES)
def test_gated_delta_rule_interpret(T, H, K, V, dtype, varlen):
  harness.check_op(GDN, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu", interpret=True, varlen=varlen)


def test_delta_rule_interpret():
  harness.check_op(DELTA, T=70, H=1, K=16, V=16, dtype="float32", backend="gpu", interpret=True)


def test_simple_gla_interpret():
  harness.check_op(SGLA, T=100, H=1, K=64, V=100, dtype="bfloat16", backend="gpu", interpret=True)


def test_wide_values_run_as_column_slices(monkeypatch):
  """V above the kernels' limit runs as independent value slices (fla's 340M GDN has V = 512)."""
  monkeypatch.setattr(gdn_gpu, "MAX_DIM", 16)
  harness.check_op(GDN, T=70, H=1, K=16, V=40, dtype="float32", backend="gpu", interpret=True)


def test_unsupported_shapes_fall_back_or_raise():
  x = GDN.make_inputs(np.random.default_rng(0), 1, 8, 1, 300, 8)
  assert "key head dim" in gdn_gpu.unsupported(x["q"], x["k"], x["v"], x["g"])
  assert gdn_gpu.unsupported(x["q"][..., :100], x["k"][..., :100], x["v"], x["g"]) is None
  with pytest.raises(ValueError, match="cannot run"):
    GDN.chunk(*x.values(), backend="gpu", interpret=True)
  with pytest.raises(ValueError, match="cannot run these inputs"):
    gdn_gpu.run_chunk(x["q"], x["k"], x["v"], None, None, scale=1.0, interpret=True)


@pytest.mark.gpu
class TestOnGPU:
  """The correctness matrix on the device (compiled Triton kernels, no interpret mode)."""

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES)
  def test_gated_delta_rule(self, T, H, K, V, dtype):
    harness.check_op(GDN, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  @pytest.mark.parametrize("dtype", harness.DTYPES)
  def test_gated_delta_rule_varlen(self, dtype):
    harness.check_op(GDN, T=300, H=2, K=64, V=32, dtype=dtype, backend="gpu", varlen=True)

  def test_gated_delta_rule_varlen_equals_loop(self):
    harness.check_varlen_matches_loop(GDN, backend="gpu")

  @pytest.mark.parametrize("K,V", [(128, 128), (64, 256)])
  def test_gated_delta_rule_bf16_long(self, K, V):
    harness.check_op(GDN, T=4096, H=2, K=K, V=V, dtype="bfloat16", backend="gpu", B=1)

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[::3])
  def test_delta_rule(self, T, H, K, V, dtype):
    harness.check_op(DELTA, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  def test_delta_rule_varlen_bf16_long(self):
    harness.check_op(DELTA, T=4096, H=2, K=128, V=128, dtype="bfloat16", backend="gpu", B=1)
    harness.check_op(DELTA, T=300, H=2, K=64, V=32, dtype="bfloat16", backend="gpu", varlen=True)

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[1::3])
  def test_simple_gla(self, T, H, K, V, dtype):
    harness.check_op(SGLA, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  def test_simple_gla_varlen_bf16_long(self):
    harness.check_op(SGLA, T=4096, H=2, K=128, V=128, dtype="bfloat16", backend="gpu", B=1)
    harness.check_op(SGLA_G, T=300, H=2, K=64, V=32, dtype="bfloat16", backend="gpu", varlen=True)

  def test_auto_picks_gpu(self):
    assert jax.default_backend() == "gpu"
    x = GDN.make_inputs(np.random.default_rng(0), 1, 64, 1, 16, 16)
    o_auto = GDN.chunk(*x.values())[0]
    o_gpu = GDN.chunk(*x.values(), backend="gpu")[0]
    assert jnp.array_equal(o_auto, o_gpu)
