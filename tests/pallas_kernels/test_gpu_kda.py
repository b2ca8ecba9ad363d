"""The KDA Pallas GPU kernels (Triton lowering, `pallas_kernels/kda/gpu.py` on the per-channel path
of the common/gpu stages) against the float32 reference through the shared harness: interpret mode
on CPU (two chunk cases and one decode case: each chunk case compiles its kernels in ~20 s of CPU),
and the device matrix on a real GPU (marker `gpu`), gate logits scaled by 0.01 and 10 up to
T = 32,768 in bf16."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.common.gpu.config import Config
from pallas_kernels.kda import gpu as kda_gpu
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import KDA, kda_inputs

pytestmark = pytest.mark.slow


def gates_scaled(gate_scale, gate_shift=2.0):
  """KDA with its gate logits scaled: 10 gives per-channel log decays down to about -30 per step
  (chunk cumsums in the hundreds next to channels near 0), 0.01 nearly constant decays."""
  return dataclasses.replace(
      KDA, name=f"kda[gates x{gate_scale}]",
      make_inputs=lambda *a: kda_inputs(*a, gate_scale=gate_scale, gate_shift=gate_shift))


STEEP, GENTLE = gates_scaled(10.0, 0.0), gates_scaled(0.01)

# (case, T, H, K, V, dtype, varlen): odd T, K = 100 (padded to 128), V != K, both dtypes, H = 2
# (each head its own gates), packed varlen with an empty sequence, steep gates in float32, and a V
# above 256 (320, padded to 384: more value tiles in the same kernels).
INTERPRET_CASES = [
    (KDA, 65, 2, 100, 48, "bfloat16", False),
    (STEEP, 150, 2, 16, 32, "float32", True),
    (KDA, 70, 1, 16, 320, "float32", True),
]


@pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", INTERPRET_CASES,
                         ids=lambda x: getattr(x, "name", None))
def test_chunk_interpret(case, T, H, K, V, dtype, varlen):
  harness.check_op(case, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu", interpret=True,
                   varlen=varlen)


def test_state_in_key_blocks_interpret(monkeypatch):
  """The per-channel state passes with their state as blocks of 16 key rows (Config.bk_state), each
  decayed by its own rows' gates; K = 48 padded to 64: four blocks."""
  monkeypatch.setitem(kda_gpu.chunk_kda.__kwdefaults__, "config",
                      kda_gpu.Config(shared=Config(bk_state=16)))
  harness.check_op(STEEP, T=100, H=2, K=48, V=32, dtype="float32", backend="gpu", interpret=True,
                   varlen=True)


def test_the_forward_keeps_the_states_interpret(monkeypatch):
  """The forward's chunk-start states and v' kept for the backward (Config.keep_states), with the
  forward's scores over key tiles of 64 (Config.bk_scores_fwd) and the backward's of 32."""
  monkeypatch.setitem(kda_gpu.chunk_kda.__kwdefaults__, "config",
                      kda_gpu.Config(shared=Config(keep_states=True), bk_scores_fwd=64))
  harness.check_op(STEEP, T=100, H=2, K=128, V=32, dtype="float32", backend="gpu", interpret=True,
                   varlen=True)


def test_the_scores_in_two_launches_interpret(monkeypatch):
  """The forward's score kernel launched twice, A with kg and P with qg
  (Config.split_scores_fwd), as one launch forms them."""
  monkeypatch.setitem(kda_gpu.chunk_kda.__kwdefaults__, "config",
                      kda_gpu.Config(split_scores_fwd=True))
  harness.check_op(STEEP, T=100, H=2, K=64, V=32, dtype="float32", backend="gpu", interpret=True,
                   varlen=True)


def test_disable_recompute_spares_the_backward_a_state_pass():
  """fla's `disable_recompute=True` keeps the GPU kernels' states for the backward."""
  B, T, H, K, V = 1, 128, 2, 32, 32
  rng = np.random.default_rng(0)
  q, k, v, g, beta = (jnp.asarray(x) for x in kda_inputs(rng, B, T, H, K, V).values())

  def kernels(**kw):
    loss = lambda *a: jnp.sum(KDA.chunk(*a, backend="gpu", interpret=True, **kw)[0])
    return str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, g, beta)).count("pallas_call")

  assert kernels(disable_recompute=True) == kernels() - 1


def test_fused_recurrent_interpret():
  harness.check_op(STEEP, kind="fused_recurrent", T=37, H=2, K=100, V=24, dtype="float32",
                   backend="gpu", interpret=True, varlen=True)


def test_kernels_lower_to_triton():
  """Every kernel goes through Pallas' Triton lowering on CPU (jax.export for CUDA): catches
  constructs the lowering rejects before a GPU run; PTX compilation happens only on a GPU."""
  sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
  B, T, H, K, V = 1, 128, 2, 64, 32
  x = (sd(B, T, H, K), sd(B, T, H, K), sd(B, T, H, V), sd(B, T, H, K, dt=jnp.float32),
       sd(B, T, H, dt=jnp.float32))
  cu = sd(3, dt=jnp.int32)
  loss = lambda *a: jnp.sum(KDA.chunk(*a[:5], cu_seqlens=a[5], backend="gpu")[0].astype(jnp.float32))
  ops = {  # the gradient alone needs no forward state pass (o is not a residual): 3 + 5 kernels
      "chunk varlen fwd+bwd": (lambda *a: jax.grad(loss, argnums=tuple(range(5)))(*a), 8),
      "recurrent varlen": (lambda *a: KDA.fused_recurrent(*a[:5], cu_seqlens=a[5], backend="gpu"), 1),
  }
  for name, (f, n_kernels) in ops.items():
    assert harness.triton_kernel_count(f, *x, cu) == n_kernels, name


def test_unsupported_inputs_fall_back_or_raise():
  x = kda_inputs(np.random.default_rng(0), 1, 8, 1, 300, 8)
  assert "key head dim" in kda_gpu.unsupported(*x.values())
  narrow = {n: a[..., :100] if a.ndim == 4 and n != "v" else a for n, a in x.items()}
  assert kda_gpu.unsupported(*narrow.values()) is None
  with pytest.raises(ValueError, match="cannot run"):
    KDA.chunk(*x.values(), backend="gpu", interpret=True)


@pytest.mark.gpu
class TestOnGPU(harness.DeviceSuite):
  """The correctness matrix on the device (compiled Triton kernels, no interpret mode)."""
  CASE = KDA

  @pytest.mark.parametrize("case", [STEEP, GENTLE], ids=lambda c: c.name)
  @pytest.mark.parametrize("dtype", harness.DTYPES + ("float16",))
  def test_extreme_gates(self, case, dtype):
    harness.check_op(case, T=300, H=2, K=64, V=64, dtype=dtype, backend="gpu")

  @pytest.mark.parametrize("case", [STEEP, GENTLE], ids=lambda c: c.name)
  def test_extreme_gates_bf16_very_long(self, case):
    harness.check_op(case, T=32768, H=1, K=128, V=128, dtype="bfloat16", backend="gpu", B=1)

  def test_anchor_shape_bf16(self):
    harness.check_op(KDA, T=4096, H=4, K=128, V=128, dtype="bfloat16", backend="gpu", B=2)

  def test_head_dims_256(self):
    harness.check_op(KDA, T=200, H=2, K=256, V=256, dtype="bfloat16", backend="gpu", B=1)

  def test_states_kept(self, monkeypatch):
    monkeypatch.setitem(kda_gpu.chunk_kda.__kwdefaults__, "config",
                        kda_gpu.Config(shared=Config(keep_states=True)))
    harness.check_op(KDA, T=600, H=2, K=128, V=128, dtype="bfloat16", backend="gpu", varlen=True)

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[::3])
  def test_fused_recurrent(self, T, H, K, V, dtype):
    harness.check_op(KDA, kind="fused_recurrent", T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  def test_chunk_then_fused_recurrent_decode(self):
    harness.check_decode_continuation(KDA, backend="gpu")

  def test_decode_kernel_vjp_equals_chunk_kernel_vjp(self):
    harness.check_decode_vjp_matches_chunk(KDA)
