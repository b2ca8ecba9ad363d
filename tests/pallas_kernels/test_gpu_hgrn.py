"""HGRN's Pallas GPU kernels (pallas_kernels/hgrn/gpu.py, Triton lowering) against the float32
reference through the harness: interpret mode on CPU (a few small shapes, a few seconds each), the
Triton lowering of forward and backward (jax.export for CUDA on CPU), and a larger matrix on a real
GPU (marker `gpu`), x, g [4, 4096, 2048] bf16 too. The harness draws (B, T, H, K, V); HGRN's width
is D = H * V."""
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.hgrn import gpu as hgrn_gpu
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import HGRN as CASE, steep

pytestmark = pytest.mark.slow

# (case, kind, T, H, V, dtype, varlen): odd T, D = H * V not a power of two (padded to the width
# tile), both dtypes, packed varlen (one empty sequence), steep gates (log decays to about -30 a
# step), more chunks than the chunk loop unrolls (T = 1100: 18 chunks), and the decode path (T = 1:
# one chunk of one token, no chunk loop).
INTERPRET_CASES = [
    (CASE, "chunk", 65, 2, 48, "bfloat16", False),
    (CASE, "chunk", 150, 2, 40, "float32", True),
    (steep(CASE), "chunk", 65, 1, 48, "float32", False),
    (CASE, "chunk", 1100, 1, 16, "float32", False),
    (CASE, "fused_recurrent", 1, 2, 24, "float32", False),
    (CASE, "fused_recurrent", 20, 2, 40, "bfloat16", True),
]


@pytest.mark.parametrize("case,kind,T,H,V,dtype,varlen", INTERPRET_CASES,
                         ids=[f"{c[0].name}-{c[1]}-T{c[2]}-D{c[3] * c[4]}-{c[5]}{'-varlen' if c[6] else ''}"
                              for c in INTERPRET_CASES])
def test_hgrn_gpu_interpret(case, kind, T, H, V, dtype, varlen):
  harness.check_op(case, kind=kind, T=T, H=H, K=1, V=V, dtype=dtype, backend="gpu", interpret=True,
                   varlen=varlen)


def test_hgrn_kernels_lower_to_triton():
  """Forward and backward, dense and varlen, and the one-chunk decode path go through Pallas'
  Triton lowering on CPU (jax.export for CUDA): catches constructs the lowering rejects before a GPU
  run; PTX compilation happens only on a GPU."""
  sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
  x, g, cu = sd(1, 1100, 96), sd(1, 1100, 96, dt=jnp.float32), sd(4, dt=jnp.int32)

  def grad(**kw):
    def loss(x, g, h0):
      o, S = CASE.chunk(x, g, h0, output_final_state=True, backend="gpu", **kw)
      return jnp.sum(o.astype(jnp.float32)) + jnp.sum(S)
    return jax.grad(loss, argnums=(0, 1, 2))

  ops = {  # name: (function, arguments, Triton kernels: 3 forward + 3 backward, 1 for decoding)
      "chunk fwd+bwd": (lambda x, g: grad()(x, g, jnp.zeros((1, 96))), (x, g), 6),
      "varlen fwd+bwd": (lambda x, g, cu: grad(cu_seqlens=cu)(x, g, jnp.zeros((3, 96))), (x, g, cu), 6),
      "decode": (lambda x, g: CASE.fused_recurrent(x[:, :1], g[:, :1], backend="gpu"), (x, g), 1),
  }
  for name, (f, args, kernels) in ops.items():
    assert harness.triton_kernel_count(f, *args) == kernels, name


def test_unsupported_dtypes():
  x = jnp.zeros((1, 8, 16), jnp.bfloat16)
  assert hgrn_gpu.unsupported(x, x.astype(jnp.float32)) is None
  assert "dtype int32" in hgrn_gpu.unsupported(x.astype(jnp.int32), x)
  with pytest.raises(ValueError, match="cannot run these inputs"):
    hgrn_gpu.chunk_hgrn(x, x.astype(jnp.int8), initial_state=jnp.zeros((1, 16), jnp.float32),
                         interpret=True)


@pytest.mark.gpu
class TestOnGPU:
  """The correctness matrix on the device (compiled Triton kernels, no interpret mode)."""

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES)
  def test_chunk(self, T, H, K, V, dtype):
    harness.check_op(CASE, T=T, H=H, K=1, V=V, dtype=dtype, backend="gpu")

  @pytest.mark.parametrize("dtype", harness.DTYPES)
  @pytest.mark.parametrize("kind", ["chunk", "fused_recurrent"])
  def test_varlen(self, kind, dtype):
    harness.check_op(CASE, kind=kind, T=300, H=2, K=1, V=100, dtype=dtype, backend="gpu", varlen=True)

  @pytest.mark.parametrize("T", [1, 37])
  def test_fused_recurrent(self, T):
    harness.check_op(CASE, kind="fused_recurrent", T=T, H=3, K=1, V=100, dtype="bfloat16", backend="gpu")

  def test_steep_gates(self):
    harness.check_op(steep(CASE), T=300, H=2, K=1, V=64, dtype="float32", backend="gpu")

  def test_anchor_shape_bf16(self):
    """x, g [4, 4096, 2048] bf16 (the benchmark's shape) against the float32 reference."""
    harness.check_op(dataclasses.replace(CASE, float_inputs=("x", "g")), B=4, T=4096, H=16, K=1, V=128, dtype="bfloat16", backend="gpu")

  def test_varlen_long(self):
    harness.check_op(CASE, T=4096, H=16, K=1, V=128, dtype="bfloat16", backend="gpu", varlen=True)

  def test_varlen_equals_loop(self):
    harness.check_varlen_matches_loop(CASE, backend="gpu")

  def test_chunk_then_fused_recurrent_decode(self):
    harness.check_decode_continuation(CASE, backend="gpu")

  def test_fwd_bwd_compiles_fast(self):
    """Forward + backward at the anchor shape compiles in well under 20 s."""
    x = jnp.zeros((4, 4096, 2048), jnp.bfloat16)
    loss = lambda x, g: jnp.sum(CASE.chunk(x, g, backend="gpu")[0].astype(jnp.float32))
    t0 = time.perf_counter()
    jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, x).compile()
    assert time.perf_counter() - t0 < 10.0

  def test_auto_picks_gpu(self):
    x = CASE.make_inputs(np.random.default_rng(0), 1, 64, 1, 1, 16)
    assert jnp.array_equal(CASE.chunk(*x.values())[0], CASE.chunk(*x.values(), backend="gpu")[0])
