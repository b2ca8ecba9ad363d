"""mLSTM's Pallas GPU kernels (pallas_kernels/mlstm/gpu.py and gpu_chunk.py, Triton lowering)
against the float32 reference through the harness: o, the final state (C, n, m) and the gradients
of q, k, v, i, f and of every initial-state leaf. Interpret mode on CPU (few, small cases: each
compiles the kernels in seconds of CPU), the Triton lowering of forward, backward and decode
(jax.export for CUDA on CPU), and the device matrix on a real GPU (marker `gpu`)."""
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.mlstm import gpu as mlstm_gpu
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import MLSTM, mlstm_inputs

pytestmark = pytest.mark.slow

# Gate pre-activations at scale 10 with sigmoid(f) centred on 1/2: input gates exp(+-30), forget
# gates down to exp(-30) a step, chunk sums of log f in the hundreds (test_mlstm.py's hardest
# regime, where the stabilizer's max switches sides within chunks).
STEEP = dataclasses.replace(MLSTM, name="mlstm[steep]", make_inputs=lambda *a: mlstm_inputs(
    *a, gate_scale=10.0, i_shift=0.0, f_shift=0.0))

# (case, kind, T, H, K, V, dtype, varlen): odd T over three chunks with K = 100 and V = 48 (both
# padded), packed varlen with an empty sequence, steep gates, and the decode kernel (varlen, bf16).
INTERPRET_CASES = [
    (MLSTM, "chunk", 131, 2, 100, 48, "bfloat16", False),
    (MLSTM, "chunk", 150, 2, 32, 16, "float32", True),
    (STEEP, "chunk", 130, 2, 32, 16, "float32", False),
    (MLSTM, "fused_recurrent", 20, 2, 16, 40, "bfloat16", True),
]


@pytest.mark.parametrize("case,kind,T,H,K,V,dtype,varlen", INTERPRET_CASES,
                         ids=[f"{c[0].name}-{c[1]}-T{c[2]}-K{c[4]}-V{c[5]}-{c[6]}"
                              + ("-varlen" if c[7] else "") for c in INTERPRET_CASES])
def test_interpret(case, kind, T, H, K, V, dtype, varlen):
  harness.check_op(case, kind=kind, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu", interpret=True,
                   varlen=varlen)


def test_kernels_lower_to_triton():
  """Forward, forward+backward (dense and varlen, every output differentiated) and decode go
  through Pallas' Triton lowering on CPU (jax.export for CUDA): catches constructs the lowering
  rejects before a GPU run; PTX compilation happens only on a GPU."""
  sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
  B, T, H, K, V = 1, 128, 2, 64, 32
  x = (sd(B, T, H, K), sd(B, T, H, K), sd(B, T, H, V), sd(B, T, H, dt=jnp.float32),
       sd(B, T, H, dt=jnp.float32))
  cu = sd(3, dt=jnp.int32)

  def grads(**kw):
    def loss(*a):
      o, (C, n, m) = MLSTM.chunk(*a, output_final_state=True, backend="gpu", **kw)
      return jnp.sum(o.astype(jnp.float32)) + jnp.sum(C) + jnp.sum(n) + jnp.sum(m)
    return jax.grad(loss, argnums=tuple(range(5)))

  ops = {  # name: (function, arguments, Triton kernels: 1 forward, 2 backward, 1 decoding)
      "chunk fwd": (lambda *a: MLSTM.chunk(*a, backend="gpu"), x, 1),
      "chunk fwd+bwd": (grads(), x, 3),
      "chunk varlen fwd+bwd": (lambda *a: grads(cu_seqlens=a[5])(*a[:5]), x + (cu,), 3),
      "decode varlen": (lambda *a: MLSTM.fused_recurrent(*a[:5], cu_seqlens=a[5], backend="gpu"),
                        x + (cu,), 1),
  }
  for name, (f, args, kernels) in ops.items():
    assert harness.triton_kernel_count(f, *args) == kernels, name


def test_unsupported_inputs_fall_back_or_raise():
  x = mlstm_inputs(np.random.default_rng(0), 1, 8, 1, 300, 8)
  assert "K=300" in mlstm_gpu.unsupported(*x.values())
  narrow = dict(x, q=x["q"][..., :256], k=x["k"][..., :256])
  assert mlstm_gpu.unsupported(*narrow.values()) is None
  ints = dict(narrow, q=narrow["q"].astype(jnp.int32))
  assert "dtype int32" in mlstm_gpu.unsupported(*ints.values())
  with pytest.raises(ValueError, match="cannot run"):
    MLSTM.chunk(*x.values(), backend="gpu", interpret=True)


@pytest.mark.gpu
class TestOnGPU(harness.DeviceSuite):
  """The correctness matrix on the device (compiled Triton kernels, no interpret mode)."""
  CASE = MLSTM

  @pytest.mark.parametrize("dtype", harness.DTYPES)
  def test_steep_gates(self, dtype):
    harness.check_op(STEEP, T=300, H=2, K=64, V=64, dtype=dtype, backend="gpu")

  def test_float16_wide_v(self):
    """f16, K = V = 256 (the largest tile) and V = 300 (two value slices)."""
    harness.check_op(MLSTM, T=200, H=2, K=256, V=256, dtype="float16", backend="gpu", B=1)
    harness.check_op(MLSTM, T=100, H=1, K=64, V=300, dtype="bfloat16", backend="gpu", B=1)

  def test_anchor_shape_bf16(self):
    harness.check_op(MLSTM, T=4096, H=4, K=128, V=128, dtype="bfloat16", backend="gpu", B=2)

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[::3])
  def test_fused_recurrent(self, T, H, K, V, dtype):
    harness.check_op(MLSTM, kind="fused_recurrent", T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  def test_fused_recurrent_varlen(self):
    harness.check_op(MLSTM, kind="fused_recurrent", T=300, H=2, K=64, V=32, dtype="bfloat16",
                     backend="gpu", varlen=True)

  def test_chunk_then_fused_recurrent_decode(self):
    harness.check_decode_continuation(MLSTM, backend="gpu")

  def test_decode_kernel_vjp_equals_chunk_kernel_vjp(self):
    harness.check_decode_vjp_matches_chunk(MLSTM, backend="gpu")

  def test_fwd_bwd_compiles_fast(self):
    """Forward + backward at the anchor shape (B=4, T=4096, H=16, K=V=128 bf16) compiles in
    under 20 s."""
    q = jnp.zeros((4, 4096, 16, 128), jnp.bfloat16)
    g = jnp.zeros((4, 4096, 16), jnp.float32)
    loss = lambda *a: jnp.sum(MLSTM.chunk(*a, backend="gpu")[0].astype(jnp.float32))
    t0 = time.perf_counter()
    jax.jit(jax.grad(loss, argnums=tuple(range(5)))).lower(q, q, q, g, g).compile()
    assert time.perf_counter() - t0 < 20.0

  def test_auto_takes_the_gpu_kernel(self):
    x = MLSTM.make_inputs(np.random.default_rng(0), 1, 64, 1, 16, 16)
    assert jnp.array_equal(MLSTM.chunk(*x.values())[0], MLSTM.chunk(*x.values(), backend="gpu")[0])
