"""The GLA Pallas GPU kernels (Triton lowering, `pallas_kernels/gla/gpu.py`) and RWKV-6 on them
(`pallas_kernels/rwkv6/gpu.py`) against the float32 reference through the shared harness: interpret
mode on CPU (few, small cases: each compiles its kernels in ~15 s of CPU), and larger shapes on a
real GPU (marker `gpu`)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.common.gpu.config import Config as SharedConfig
from pallas_kernels.gla import gpu as gla_gpu
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import GLA, RWKV6

pytestmark = pytest.mark.slow


def gates_scaled(case, gate_scale):
  """`case` with its gate logits scaled: 10 gives log decays down to about -30 per step, 0.01
  nearly constant decays."""
  return dataclasses.replace(case, name=f"{case.name}[gates x{gate_scale}]",
                             make_inputs=lambda *a: case.make_inputs(*a, gate_scale=gate_scale))


STEEP, GENTLE = gates_scaled(GLA, 10.0), gates_scaled(GLA, 0.01)
RWKV6_STEEP = gates_scaled(RWKV6, 10.0)

# (case, T, H, K, V, dtype, varlen): odd T, K = 100 (padded to 128), V != K, both dtypes, H = 2
# (each head its own gates), packed varlen with an empty sequence, steep and gentle gates.
INTERPRET_CASES = [
    (GLA, 65, 2, 100, 48, "bfloat16", False),
    (GLA, 150, 2, 32, 16, "float32", True),
    (STEEP, 130, 2, 16, 32, "bfloat16", False),
    (GENTLE, 70, 2, 16, 16, "float32", False),
    (RWKV6_STEEP, 100, 2, 32, 16, "bfloat16", True),   # the exclusive mode and the bonus u
]


@pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", INTERPRET_CASES,
                         ids=lambda x: getattr(x, "name", None))
def test_chunk_interpret(case, T, H, K, V, dtype, varlen):
  harness.check_op(case, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu", interpret=True,
                   varlen=varlen)


def test_chunk_interpret_with_p_t_do_split_out(monkeypatch):
  """The dh pass reading P^T do from `chunk_dh.dv_local_pass` (the default above K = 128, here
  forced at K = 32): the per-channel path, varlen."""
  config = gla_gpu.Config(shared=SharedConfig(split_dv_local=True))
  monkeypatch.setitem(gla_gpu.chunk_gla.__kwdefaults__, "config", config)
  harness.check_op(GLA, T=150, H=2, K=32, V=16, dtype="float32", backend="gpu", interpret=True,
                   varlen=True)


@pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", [(GLA, 37, 2, 100, 48, "float32", False),
                                                        (RWKV6, 20, 2, 16, 40, "bfloat16", True)],
                         ids=lambda x: getattr(x, "name", None))
def test_fused_recurrent_interpret(case, T, H, K, V, dtype, varlen):
  harness.check_op(case, kind="fused_recurrent", T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu",
                   interpret=True, varlen=varlen)


@pytest.mark.parametrize("case", [GLA, RWKV6], ids=lambda c: c.name)
def test_decode_kernel_vjp_equals_chunk_kernel_vjp(case):
  harness.check_decode_vjp_matches_chunk(case, interpret=True)


def test_forward_without_gradient_matches_differentiated_forward():
  """A forward that is not differentiated does not store the chunk-start states (the state pass
  without h); its o and final state must be the differentiated forward's (varlen: the flags too)."""
  rng = np.random.default_rng(0)
  x = GLA.make_inputs(rng, 1, 40, 2, 16, 16)
  h0 = GLA.make_state(rng, 2, 2, 16, 16)
  cu = jnp.asarray([0, 15, 40], jnp.int32)
  f = lambda *a: GLA.chunk(*a, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                           backend="gpu", interpret=True)
  plain = jax.jit(f)(*x.values())
  primal = jax.jit(lambda *a: jax.vjp(f, *a)[0])(*x.values())
  for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(primal)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6,
                               atol=1e-6)


def test_kernels_lower_to_triton():
  """Every kernel goes through Pallas' Triton lowering on CPU (jax.export for CUDA): catches
  constructs the lowering rejects before a GPU run; PTX compilation happens only on a GPU."""
  sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
  B, T, H, K, V = 1, 128, 2, 64, 32
  x = (sd(B, T, H, K), sd(B, T, H, K), sd(B, T, H, V), sd(B, T, H, K, dt=jnp.float32))
  cu = sd(3, dt=jnp.int32)
  u = sd(H, K, dt=jnp.float32)
  grads = lambda op, n, **kw: lambda *a: jax.grad(
      lambda *a: jnp.sum(op(*a, backend="gpu", **kw)[0].astype(jnp.float32)),
      argnums=tuple(range(n)))(*a)
  ops = {
      "chunk fwd+bwd": (grads(GLA.chunk, 4), x, 5),
      "chunk varlen fwd+bwd": (lambda *a: grads(GLA.chunk, 4, cu_seqlens=a[4])(*a[:4]),
                               x + (cu,), 5),
      "rwkv6 fwd+bwd": (grads(RWKV6.chunk, 5), x + (u,), 5),
      "recurrent varlen": (lambda *a: GLA.fused_recurrent(*a[:4], cu_seqlens=a[4], backend="gpu"),
                           x + (cu,), 1),
  }
  for name, (f, args, n_kernels) in ops.items():
    assert harness.triton_kernel_count(f, *args) == n_kernels, name


def test_unsupported_inputs_fall_back_or_raise():
  x = GLA.make_inputs(np.random.default_rng(0), 1, 8, 1, 300, 8)
  assert "head dims" in gla_gpu.unsupported(x["q"], x["k"], x["v"], x["g"])
  narrow = {n: a[..., :100] for n, a in x.items()}
  assert gla_gpu.unsupported(narrow["q"], narrow["k"], x["v"], narrow["g"]) is None
  assert "per-channel" in gla_gpu.unsupported(x["q"], x["k"], x["v"], x["g"][..., 0])
  with pytest.raises(ValueError, match="cannot run"):
    GLA.chunk(*x.values(), backend="gpu", interpret=True)


@pytest.mark.gpu
class TestOnGPU(harness.DeviceSuite):
  """The correctness matrix on the device (compiled Triton kernels, no interpret mode)."""
  CASE = GLA

  @pytest.mark.parametrize("case", [STEEP, GENTLE], ids=lambda c: c.name)
  @pytest.mark.parametrize("dtype", harness.DTYPES)
  def test_extreme_gates(self, case, dtype):
    harness.check_op(case, T=300, H=2, K=64, V=64, dtype=dtype, backend="gpu")

  def test_anchor_shape_bf16(self):
    harness.check_op(GLA, T=4096, H=4, K=128, V=128, dtype="bfloat16", backend="gpu", B=2)

  def test_steep_gates_bf16_very_long(self):
    harness.check_op(STEEP, T=32768, H=1, K=128, V=128, dtype="bfloat16", backend="gpu", B=1)

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[::3])
  def test_fused_recurrent(self, T, H, K, V, dtype):
    harness.check_op(GLA, kind="fused_recurrent", T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  @pytest.mark.parametrize("case", [GLA, RWKV6], ids=lambda c: c.name)
  def test_chunk_then_fused_recurrent_decode(self, case):
    harness.check_decode_continuation(case, backend="gpu")

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[1::3])
  def test_rwkv6(self, T, H, K, V, dtype):
    harness.check_op(RWKV6, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  @pytest.mark.parametrize("dtype", harness.DTYPES)
  def test_rwkv6_steep_varlen(self, dtype):
    harness.check_op(RWKV6_STEEP, T=300, H=2, K=64, V=32, dtype=dtype, backend="gpu", varlen=True)

  def test_rwkv6_bf16_long(self):
    harness.check_op(RWKV6, T=4096, H=2, K=64, V=64, dtype="bfloat16", backend="gpu", B=1)
