"""The Pallas GPU kernels (Triton lowering: gated delta rule, delta rule, simple GLA, linear attention,
retention) against the float32 reference, through the same harness as the xla path: interpret mode
on CPU (a few small shapes: each case compiles its kernels, ~5 s of CPU each), and the whole matrix
on a real GPU (marker `gpu`), bf16 at T = 4096 too."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.common import dispatch
from pallas_kernels.common.gpu.config import (Config, state_stages, state_value_block,
                                               states_kept)
from pallas_kernels.gated_delta_rule import gpu as gdn_gpu
from pallas_kernels.simple_gla import gpu as simple_gla_gpu
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import (DELTA_RULE as DELTA, GDN, LINEAR_ATTN as LINEAR,
                                        LINEAR_ATTN_NORMALIZED as LINEAR_NORM, RETENTION,
                                        SIMPLE_GLA as SGLA, SIMPLE_GLA_G_ONLY as SGLA_G)

pytestmark = pytest.mark.slow

# (T, H, K, V, dtype, varlen): odd T, K = 100 (padded to 128), V = 64, both dtypes, packed varlen,
# H = 2 (each head its own gates: a kernel that reads another head's fails); V above 256 (fla's 340M
# GDN has V = 512), which runs as more value tiles in each kernel: V = 320 padded to 384 (whole-V
# blocks of no power of two, the chunk kernels' tile loops as fori_loops), V = 512 bf16 varlen.
INTERPRET_CASES = [
    (65, 2, 100, 64, "bfloat16", False),
    (150, 2, 16, 32, "float32", True),
    (70, 1, 16, 320, "float32", False),
    (100, 2, 32, 512, "bfloat16", True),
]


@pytest.mark.parametrize("T,H,K,V,dtype,varlen", INTERPRET_CASES)
def test_gated_delta_rule_interpret(T, H, K, V, dtype, varlen):
  harness.check_op(GDN, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu", interpret=True, varlen=varlen)


def test_delta_rule_interpret():
  harness.check_op(DELTA, T=70, H=2, K=16, V=16, dtype="float32", backend="gpu", interpret=True)


def test_simple_gla_interpret():
  harness.check_op(SGLA, T=100, H=2, K=64, V=100, dtype="bfloat16", backend="gpu", interpret=True)
  harness.check_op(SGLA_G, T=80, H=2, K=16, V=16, dtype="float32", backend="gpu", interpret=True,
                   varlen=True)


# (case, T, H, K, V, dtype, varlen) of the families that run on simple GLA's chunked kernels
ADAPTER_CASES = [
    (LINEAR, 70, 2, 32, 48, "float32", False),
    (LINEAR_NORM, 65, 2, 16, 16, "bfloat16", True),
    (RETENTION, 90, 3, 16, 32, "bfloat16", False),
]


@pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", ADAPTER_CASES, ids=lambda x: getattr(x, "name", None))
def test_simple_gla_adapters_interpret(case, T, H, K, V, dtype, varlen):
  harness.check_op(case, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu", interpret=True, varlen=varlen)


# (case, T, H, K, V, dtype, varlen) of the token-by-token (decode) kernel, common/gpu/fused_recurrent.py
RECURRENT_CASES = [
    (GDN, 37, 2, 100, 48, "float32", False),
    (GDN, 20, 2, 16, 40, "bfloat16", True),
    (DELTA, 30, 2, 16, 16, "float32", False),
    (SGLA, 25, 2, 32, 64, "bfloat16", True),
    (LINEAR, 21, 2, 16, 32, "float32", True),
    (LINEAR_NORM, 18, 2, 32, 16, "bfloat16", False),
    (RETENTION, 23, 3, 16, 16, "float32", False),
]


@pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", RECURRENT_CASES, ids=lambda x: getattr(x, "name", None))
def test_fused_recurrent_interpret(case, T, H, K, V, dtype, varlen):
  harness.check_op(case, kind="fused_recurrent", T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu",
                   interpret=True, varlen=varlen)


@pytest.mark.parametrize("case", [GDN, SGLA_G], ids=lambda c: c.name)
def test_decode_kernel_vjp_equals_chunk_kernel_vjp(case):
  harness.check_decode_vjp_matches_chunk(case, interpret=True)


def test_kernels_lower_to_triton():
  """Every GPU kernel goes through Pallas' Triton lowering on CPU (jax.export for CUDA): catches
  constructs the lowering rejects before a GPU run; PTX compilation happens only on a GPU."""
  sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
  B, T, H, K, V = 1, 128, 2, 64, 64
  x = (sd(B, T, H, K), sd(B, T, H, K), sd(B, T, H, V), sd(B, T, H, dt=jnp.float32),
       sd(B, T, H, dt=jnp.float32))
  cu = sd(3, dt=jnp.int32)

  def chunk_grad(case, n_args):  # every stage of a family's forward and backward
    loss = lambda *a: jnp.sum(case.chunk(*a, backend="gpu")[0].astype(jnp.float32))
    return lambda *a: jax.grad(loss, argnums=tuple(range(n_args)))(*a)

  ops = {
      "gdn chunk fwd+bwd": (chunk_grad(GDN, 5), x),
      "gdn recurrent": (lambda *a: GDN.fused_recurrent(*a, backend="gpu"), x),
      "gdn recurrent varlen": (lambda *a: GDN.fused_recurrent(*a[:5], cu_seqlens=a[5], backend="gpu"),
                               x + (cu,)),
      # packed sequences with initial and final states: each state pass starts its final states
      # as the initial ones (kernel_math.walk_chunks)
      "gdn chunk varlen fwd+bwd with states": (
          lambda *a: jax.grad(lambda h0, *a: sum(jnp.sum(o.astype(jnp.float32)) for o in GDN.chunk(
              *a[:5], cu_seqlens=a[5], initial_state=h0, output_final_state=True, backend="gpu")),
              argnums=(0, 1, 2, 3))(*a), (sd(2, H, K, V, dt=jnp.float32),) + x + (cu,)),
      "simple gla chunk fwd+bwd": (chunk_grad(SGLA_G, 4), x[:4]),
      "simple gla chunk varlen": (lambda *a: SGLA_G.chunk(*a[:4], cu_seqlens=a[4], backend="gpu"),
                                  x[:4] + (cu,)),
      "simple gla recurrent": (lambda *a: SGLA_G.fused_recurrent(*a, backend="gpu"), x[:4]),
  }
  for name, (f, args) in ops.items():
    assert harness.triton_kernel_count(f, *args) >= 1, name


# (case, the op's gpu function, T, K, dtype, varlen): the state passes with their state held as
# blocks of 16 key rows (Config.bk_state; fla's layout at K = 256 is four [64, BV] blocks): K = 40
# padded to 64, four blocks, with and without the delta correction, varlen hand-overs per block; the
# gated delta rule's WY backward in key tiles of 16 alike (Config.bk_wy_bwd), its w and u formed
# again in the backward from T (Config.keep_wu=False, the default above K = 128).
KEY_BLOCK_CASES = [
    (GDN, gdn_gpu.chunk_gated_delta_rule, 100, 40, "float32", True),
    (SGLA, simple_gla_gpu.chunk_simple_gla, 70, 64, "bfloat16", False),
]


@pytest.mark.parametrize("case,fn,T,K,dtype,varlen", KEY_BLOCK_CASES, ids=lambda x: getattr(x, "name", None))
def test_state_in_key_blocks_interpret(monkeypatch, case, fn, T, K, dtype, varlen):
  monkeypatch.setitem(fn.__kwdefaults__, "config", Config(bk_state=16, bk_wy_bwd=16, keep_wu=False))
  harness.check_op(case, T=T, H=2, K=K, V=32, dtype=dtype, backend="gpu", interpret=True, varlen=varlen)


# (case, the op's gpu function, split_output, varlen): the chunk-start states (and the delta rule's
# v') kept by the forward for the backward (Config.keep_states) instead of formed again there, from
# the state pass that forms o (fused) and from the one before chunk_o (split).
KEEP_STATES_CASES = [
    (GDN, gdn_gpu.chunk_gated_delta_rule, False, True),
    (GDN, gdn_gpu.chunk_gated_delta_rule, True, False),
    (SGLA, simple_gla_gpu.chunk_simple_gla, True, True),
]


@pytest.mark.parametrize("case,fn,split,varlen", KEEP_STATES_CASES, ids=lambda x: getattr(x, "name", None))
def test_the_forward_keeps_the_states_interpret(monkeypatch, case, fn, split, varlen):
  monkeypatch.setitem(fn.__kwdefaults__, "config", Config(keep_states=True, split_output=split))
  harness.check_op(case, T=100, H=2, K=32, V=32, dtype="float32", backend="gpu", interpret=True,
                   varlen=varlen)


def _kernel_count(fn, *args) -> int:
  """pallas_calls in the gradient of sum(fn(*args)[0]) with respect to the first three args."""
  loss = lambda *a: jnp.sum(fn(*a)[0])
  return str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*args)).count("pallas_call")


def test_kept_states_spare_the_backward_a_state_pass():
  B, T, H, K, V = 1, 128, 2, 32, 32
  x = (jnp.ones((B, T, H, K)), jnp.ones((B, T, H, K)), jnp.ones((B, T, H, V)), -jnp.ones((B, T, H)),
       jnp.ones((B, T, H)) / 2)
  h0 = jnp.zeros((B, H, K, V))
  for split in (False, True):
    counts = [_kernel_count(functools.partial(gdn_gpu.chunk_gated_delta_rule, scale=0.5,
                                              initial_state=h0, interpret=True, config=config), *x)
              for config in (Config(split_output=split), Config(keep_states=True, split_output=split))]
    assert counts[1] == counts[0] - 1
  # the public op under `states_kept` (what ModelConfig.keep_states sets for a model's layers)
  public = functools.partial(GDN.chunk, backend="gpu", interpret=True)
  plain = _kernel_count(public, *x)
  with states_kept():
    assert _kernel_count(public, *x) == plain - 1
    with states_kept(False):  # an inner False (a layer or op not asking) leaves the outer choice
      assert _kernel_count(public, *x) == plain - 1


def test_keeping_the_states_keeps_w_and_u():
  assert gdn_gpu.keeps_w_u(Config(keep_states=True), 256)
  assert not gdn_gpu.keeps_w_u(Config(keep_states=True, keep_wu=False), 256)


# (config, K, per_channel) -> stages of the state passes and of the dh pass: above K = 128 two
# stages only where the state is held in blocks of at most 128 key rows, the dh pass as the state
# passes unless `stages_dh` says otherwise.
STAGES_CASES = [
    (Config(), 128, False, 2, 2), (Config(), 256, False, 2, 2), (Config(bk_state=256), 256, False, 1, 1),
    (Config(stages_dh=1), 256, False, 2, 1), (Config(stages_state=3), 64, False, 3, 3),
    (Config(bk_state=64), 256, True, 1, 1), (Config(), 128, True, 2, 2),
]


@pytest.mark.parametrize("config,K,per_channel,state,dh", STAGES_CASES)
def test_state_stages(config, K, per_channel, state, dh):
  assert (state_stages(config, K, per_channel), state_stages(config, K, per_channel, dh=True)) == (state, dh)


def test_the_forward_keeps_w_and_u_up_to_k_128():
  assert gdn_gpu.keeps_w_u(Config(), 128) and not gdn_gpu.keeps_w_u(Config(), 256)
  assert gdn_gpu.keeps_w_u(Config(keep_wu=True), 256) and not gdn_gpu.keeps_w_u(Config(keep_wu=False), 64)


# (config, B, H, K, V, per_channel, is_varlen) -> value columns per state-pass program (132 SMs off
# a GPU): 16 only for scalar gates above K = 128 without packed sequences when 32 leaves SMs idle,
# and whatever the config says.
VALUE_BLOCK_CASES = [
    (Config(), 1, 4, 256, 512, False, False, 16), (Config(), 8, 4, 256, 512, False, False, 32),
    (Config(), 1, 4, 128, 128, False, False, 32), (Config(), 1, 4, 256, 512, True, False, 32),
    (Config(), 1, 4, 256, 512, False, True, 32), (Config(bv_state=64), 1, 4, 256, 512, False, True, 64),
]


@pytest.mark.parametrize("config,B,H,K,V,per_channel,is_varlen,bv", VALUE_BLOCK_CASES)
def test_state_value_block(config, B, H, K, V, per_channel, is_varlen, bv):
  assert state_value_block(config, B, H, K, V, per_channel, is_varlen) == bv


def test_the_dh_pass_takes_its_own_value_tile():
  config = Config(bv_state=64, bv_dh=32)
  assert [state_value_block(config, 8, 4, 256, 512, False, False, dh=dh) for dh in (False, True)] == [64, 32]
  assert state_value_block(Config(bv_state=64), 8, 4, 256, 512, False, False, dh=True) == 64


def test_state_value_block_counts_the_segments():
  """On 4 segments (a vmap axis) B=1 H=4 V=512 launches 256 programs at 32 columns: no halving."""
  from pallas_kernels.common import segments
  seen = []
  def one_segment(x):
    seen.append(state_value_block(Config(), 1, 4, 256, 512, False, False))
    return x
  jax.vmap(one_segment, axis_name=segments.AXIS)(jnp.zeros(4))
  assert seen == [32] and state_value_block(Config(), 1, 4, 256, 512, False, False) == 16


# (case, the op's gpu function, T, K, V, dtype, varlen, config): the stages split out of the state
# passes above K = 128, forced at smaller K. The forward's output by the chunk-parallel kernel after
# a state pass that writes h, v' and the final state (Config.split_output), with and without the
# delta correction and key blocks (K = 128: the output kernel's two key tiles), varlen final states
# per sequence; the backward's P^T do before the dh pass (Config.split_dv_local).
SPLIT_CASES = [
    (GDN, gdn_gpu.chunk_gated_delta_rule, 100, 40, 48, "float32", True, Config(split_output=True)),
    (GDN, gdn_gpu.chunk_gated_delta_rule, 70, 64, 64, "bfloat16", False,
     Config(split_output=True, bk_state=16)),
    (GDN, gdn_gpu.chunk_gated_delta_rule, 70, 128, 32, "float32", False, Config(split_output=True)),
    (GDN, gdn_gpu.chunk_gated_delta_rule, 100, 40, 48, "float32", True, Config(split_dv_local=True)),
    (SGLA, simple_gla_gpu.chunk_simple_gla, 70, 64, 32, "bfloat16", False,
     Config(split_dv_local=True)),
    (SGLA, simple_gla_gpu.chunk_simple_gla, 70, 64, 32, "bfloat16", True, Config(split_output=True)),
]


@pytest.mark.parametrize("case,fn,T,K,V,dtype,varlen,config", SPLIT_CASES,
                         ids=lambda x: getattr(x, "name", None))
def test_split_stages_interpret(monkeypatch, case, fn, T, K, V, dtype, varlen, config):
  monkeypatch.setitem(fn.__kwdefaults__, "config", config)
  harness.check_op(case, T=T, H=2, K=K, V=V, dtype=dtype, backend="gpu", interpret=True, varlen=varlen)


def test_wide_values_add_no_kernel_launches():
  """V above 256 runs in one launch of each kernel (the V-independent work once, no split and
  concatenation of value slices): fwd+bwd lowers for CUDA to as many Triton kernels at V = 512 and
  V = 384 (padded to no power of two) as at V = 128, at the 475M model's K = 256."""
  sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
  loss = lambda *a: jnp.sum(GDN.chunk(*a, backend="gpu")[0].astype(jnp.float32))
  grad = lambda *a: jax.grad(loss, argnums=tuple(range(5)))(*a)
  B, T, H, K = 1, 128, 2, 256
  counts = {V: harness.triton_kernel_count(grad, sd(B, T, H, K), sd(B, T, H, K), sd(B, T, H, V),
                                           sd(B, T, H, dt=jnp.float32), sd(B, T, H, dt=jnp.float32))
            for V in (128, 384, 512)}
  assert counts[384] == counts[512] == counts[128], counts


def test_unsupported_shapes_fall_back_or_raise():
  x = GDN.make_inputs(np.random.default_rng(0), 1, 8, 1, 300, 8)
  assert "key head dim" in gdn_gpu.unsupported(x["q"], x["k"], x["v"], x["g"])
  assert gdn_gpu.unsupported(x["q"][..., :100], x["k"][..., :100], x["v"], x["g"]) is None
  with pytest.raises(ValueError, match="cannot run"):
    GDN.chunk(*x.values(), backend="gpu", interpret=True)
  with pytest.raises(ValueError, match="cannot run these inputs"):
    simple_gla_gpu.chunk_simple_gla(x["q"], x["k"], x["v"], scale=1.0,
                                    initial_state=jnp.zeros((1, 1, 300, 8)), interpret=True)


@pytest.mark.gpu
class TestGatedDeltaRuleOnGPU(harness.DeviceSuite):
  CASE = GDN


@pytest.mark.gpu
class TestOnGPU:
  """The other families and kinds on the device (compiled Triton kernels, no interpret mode)."""

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[::3])
  def test_delta_rule(self, T, H, K, V, dtype):
    harness.check_op(DELTA, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  @pytest.mark.parametrize("config", [Config(), Config(bk_state=256),
                                      Config(bk_state=64, stages_state=1, warps_state=8,
                                             unrolled_value_columns=0),
                                      Config(split_output=False), Config(bv_state=16),
                                      Config(keep_states=True, keep_wu=True)],
                           ids=["default-key-blocks", "one-key-block", "key-blocks-8-warps-tile-loop",
                                "fused-output", "value-tile-16", "states-kept"])
  def test_gated_delta_rule_475m_head_dims(self, monkeypatch, config):
    """fla's 340M config (the 475M model: K = 256, V = 512) compiled, with the tile variants that
    benchmarks/ops.py --variants times at that shape."""
    monkeypatch.setitem(gdn_gpu.chunk_gated_delta_rule.__kwdefaults__, "config", config)
    harness.check_op(GDN, T=2048, H=2, K=256, V=512, dtype="bfloat16", backend="gpu", B=1)
    harness.check_op(GDN, T=600, H=2, K=256, V=512, dtype="bfloat16", backend="gpu", varlen=True)

  def test_delta_rule_varlen_bf16_long(self):
    harness.check_op(DELTA, T=4096, H=2, K=128, V=128, dtype="bfloat16", backend="gpu", B=1)
    harness.check_op(DELTA, T=300, H=2, K=64, V=32, dtype="bfloat16", backend="gpu", varlen=True)

  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[1::3])
  def test_simple_gla(self, T, H, K, V, dtype):
    harness.check_op(SGLA, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  def test_simple_gla_varlen_bf16_long(self):
    harness.check_op(SGLA, T=4096, H=2, K=128, V=128, dtype="bfloat16", backend="gpu", B=1)
    harness.check_op(SGLA_G, T=300, H=2, K=64, V=32, dtype="bfloat16", backend="gpu", varlen=True)

  @pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", RECURRENT_CASES,
                           ids=lambda x: getattr(x, "name", None))
  def test_fused_recurrent(self, case, T, H, K, V, dtype, varlen):
    harness.check_op(case, kind="fused_recurrent", T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu",
                     varlen=varlen)

  @pytest.mark.parametrize("case", [GDN, DELTA, SGLA, LINEAR, RETENTION], ids=lambda c: c.name)
  def test_chunk_then_fused_recurrent_decode(self, case):
    harness.check_decode_continuation(case, backend="gpu")

  @pytest.mark.parametrize("case", [LINEAR, RETENTION], ids=lambda c: c.name)
  @pytest.mark.parametrize("T,H,K,V,dtype", harness.SHAPE_CASES[2::4])
  def test_simple_gla_adapters(self, case, T, H, K, V, dtype):
    harness.check_op(case, T=T, H=H, K=K, V=V, dtype=dtype, backend="gpu")

  def test_auto_picks_gpu(self):
    assert jax.default_backend() == "gpu"
    x = GDN.make_inputs(np.random.default_rng(0), 1, 64, 1, 16, 16)
    o_auto = GDN.chunk(*x.values())[0]
    o_gpu = GDN.chunk(*x.values(), backend="gpu")[0]
    assert jnp.array_equal(o_auto, o_gpu)

  @pytest.mark.parametrize("case", [LINEAR, RETENTION], ids=lambda c: c.name)
  @pytest.mark.parametrize("kind", ["chunk", "fused_recurrent"])
  def test_auto_picks_gpu_for_simple_gla_adapters(self, case, kind):
    """backend="auto" on a GPU resolves to the family's gpu.py, and that runs the Triton kernels."""
    fn = dispatch.resolve(case.name, kind)
    assert isinstance(fn, functools.partial) and fn.func.__module__ == f"pallas_kernels.{case.name}.gpu"
    x = case.make_inputs(np.random.default_rng(0), 1, 64, 2, 16, 16)
    op = getattr(case, kind)
    hlo = jax.jit(lambda *a: op(*a)[0]).lower(*x.values()).as_text()
    assert "triton" in hlo
    assert jnp.array_equal(op(*x.values())[0], op(*x.values(), backend="gpu")[0])


def test_packed_rows_under_vmap():
  """The layers run packed rows as a vmap of B == 1 calls with per-row cu_seqlens (the kernels gain
  a grid axis): outputs and every gradient equal the float32 reference's."""
  x = GDN.make_inputs(np.random.default_rng(1), 2, 80, 2, 16, 16)
  cu = jnp.asarray([[0, 30, 80, 80], [0, 10, 75, 80]], jnp.int32)  # padded with an empty sequence

  def loss(args, **backend):
    def row(a, c):
      return GDN.chunk(*(t[None] for t in a), cu_seqlens=c, **backend)[0][0]
    return jnp.sum(jax.vmap(row)(args, cu) * x["v"])

  args = tuple(x.values())
  # jitted: one compile each, where the eager calls compiled every op on its own (twice the time)
  got = jax.jit(lambda a: jax.value_and_grad(loss)(a, backend="gpu", interpret=True))(args)
  want = jax.jit(lambda a: jax.value_and_grad(loss)(a, backend="reference"))(args)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    assert harness.rel_rms(a, b) < 1e-5


@pytest.mark.parametrize("spread", [1.0, 0.05])   # random keys; nearly parallel keys
def test_product_form_inverse_matches_float64(spread):
  """The WY kernel's serial-free diagonal inverse against numpy in float64."""
  from pallas_kernels.common.gpu.kernel_math import unit_lower_inverse_product
  rng = np.random.default_rng(7)
  k = rng.normal(size=(1, 32)) + spread * rng.normal(size=(16, 32))
  k /= np.linalg.norm(k, axis=1, keepdims=True)
  D = np.tril(rng.uniform(0.2, 1.0, (16, 1)) * (k @ k.T), -1)
  got = np.asarray(unit_lower_inverse_product(jnp.asarray(D, jnp.float32)))
  want = np.linalg.inv(np.eye(16) + D)
  assert np.max(np.abs(got - want)) < 1e-5 * max(1.0, np.max(np.abs(want)))


@pytest.mark.parametrize("config,K,keys", [(Config(), 128, 128), (Config(), 256, 64),
                                           (Config(bk_wy_bwd=128), 256, 128)])
def test_wy_bwd_key_block(config, K, keys):
  """The WY backward's key tiles: the whole K up to 128, 64 above, unless the Config says."""
  assert gdn_gpu.wy_bwd_key_block(config, K) == keys
