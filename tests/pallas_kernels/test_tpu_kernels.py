"""Every Mosaic TPU kernel (`tpu.py` of each family) in TPU interpret mode on CPU, through the same
harness as the XLA paths: o, final state and every gradient against the float32 reference, float32
and bf16, odd lengths, varlen, initial state (the harness always passes one). Interpret mode runs
with out-of-bounds reads raising and uninitialised memory read as NaN. Cases are few and small:
interpret mode compiles a large program per shape.

`test_lowers_for_tpu` exports forward and backward for the TPU platform (jax.export), which runs the
Pallas -> Mosaic lowering on this host: unsupported primitives and illegal block shapes fail there.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import (DELTA_RULE as DELTA, GDN, GLA, HGRN, KDA,
                                        LINEAR_ATTN_NORMALIZED as LINEAR_NORM, MLSTM, RETENTION, RWKV6,
                                        SIMPLE_GLA, mlstm_inputs, steep)

pytestmark = pytest.mark.slow


def mlstm_with(**gates):
  """MLSTM with its input maker's gate options (e.g. i_shift=-1e4: input gates that write nothing,
  so the stabilizer m follows the forget gates' log decays below -80 within 130 tokens)."""
  label = ",".join(f"{k}={v:g}" for k, v in gates.items())
  return dataclasses.replace(MLSTM, name=f"mlstm[{label}]", make_inputs=lambda *a: mlstm_inputs(*a, **gates))

# (case, T, H, K, V, dtype, varlen). Every family's adapter runs at least once; the kernels' paths
# (gate kind, varlen or padded rows, bf16, T = 1, several chunks) each in more than one family. KDA
# is the delta-rule kernel with a per-channel gate: bf16 in its varlen case, unpacked rows in its
# steep one, the 128-wide bf16 delta kernel in GDN's. Linear attention is the additive kernel's
# scalar gate at zero: its adapter in the normalized case, the scalar gate in bf16 in simple GLA's.
CASES = [
    (GDN, 130, 1, 128, 128, "bfloat16", False),
    (GDN, 130, 1, 32, 16, "float32", True),
    (DELTA, 1, 2, 16, 16, "bfloat16", False),
    (DELTA, 65, 1, 16, 32, "float32", True),
    (KDA, 130, 1, 16, 16, "bfloat16", True),
    (steep(KDA), 65, 1, 32, 16, "float32", False),
    (GLA, 65, 2, 16, 16, "float32", False),
    (GLA, 130, 1, 128, 128, "bfloat16", True),
    (RWKV6, 130, 1, 16, 32, "float32", True),
    (RWKV6, 65, 2, 128, 128, "bfloat16", False),
    (steep(RWKV6), 65, 1, 32, 16, "float32", False),
    (SIMPLE_GLA, 65, 2, 16, 16, "bfloat16", False),
    (SIMPLE_GLA, 130, 1, 32, 16, "float32", True),
    (RETENTION, 1, 2, 16, 16, "float32", False),
    (LINEAR_NORM, 65, 2, 16, 32, "float32", True),
    (HGRN, 130, 2, 16, 128, "bfloat16", False),   # D = H * V: two 128-lane tiles
    (HGRN, 130, 1, 16, 32, "float32", True),
    (steep(HGRN), 65, 1, 16, 48, "float32", False),
    (MLSTM, 65, 2, 16, 16, "float32", False),
    (MLSTM, 130, 1, 128, 128, "bfloat16", False),
    (MLSTM, 130, 1, 32, 16, "float32", True),
    (steep(MLSTM, f_shift=0.0), 65, 1, 16, 16, "float32", False),
    (mlstm_with(i_shift=-1e4, f_shift=0.0), 130, 1, 16, 16, "float32", False),  # m below -80: capped
]


@pytest.mark.parametrize("case,T,H,K,V,dtype,varlen", CASES,
                         ids=[f"{c[0].name}-T{c[1]}-K{c[3]}-{c[5]}{'-varlen' if c[6] else ''}" for c in CASES])
def test_tpu_kernel_matches_reference(case, T, H, K, V, dtype, varlen):
  harness.check_op(case, T=T, H=H, K=K, V=V, dtype=dtype, backend="tpu", interpret=True, varlen=varlen)


def test_tpu_mlstm_value_tiles_match_reference(monkeypatch):
  """A head whose [K, V] state exceeds MAX_STATE_BLOCK runs as value tiles, each a head of its own
  on the grid (two here). The threshold is lowered to 128 x 128, so that K = 128, V = 256 takes the
  tiled path K = 1,024, V = 512 takes at the real 512 x 512 (test_mlstm checks value_block's widths
  there): the same code at a fraction of the interpret-mode compile and run time."""
  from pallas_kernels.mlstm import tpu
  monkeypatch.setattr(tpu, "MAX_STATE_BLOCK", 128 * 128)
  assert tpu.value_block(128, 256) == 128
  harness.check_op(MLSTM, T=70, H=1, K=128, V=256, dtype="float32", backend="tpu", interpret=True,
                   varlen=True)


LOWER = [GDN, KDA, SIMPLE_GLA, RWKV6, HGRN, MLSTM]


@pytest.mark.parametrize("case", LOWER, ids=[c.name for c in LOWER])
def test_lowers_for_tpu(case):
  B, T, H, K, V = 1, 130, 2, 128, 128
  rng = np.random.default_rng(0)
  inputs = case.cast(case.make_inputs(rng, B, T, H, K, V), jnp.bfloat16)
  cu = jnp.array([0, 50, T], jnp.int32)
  state = case.make_state(rng, cu.shape[0] - 1, H, K, V)

  def loss(inputs, state):
    o, S = case.chunk(*inputs, initial_state=state, output_final_state=True, cu_seqlens=cu, backend="tpu")
    return jnp.sum(o.astype(jnp.float32)) + sum(jnp.sum(s) for s in jax.tree_util.tree_leaves(S))

  shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (tuple(inputs.values()), state))
  exported = jax.export.export(jax.jit(jax.grad(loss, argnums=(0, 1))), platforms=["tpu"])(*shapes)
  assert exported.mlir_module().count("tpu_custom_call") == 2  # forward and backward kernels


def test_tiny_model_with_tpu_kernels_matches_xla():
  """A tiny hybrid LM (gated DeltaNet + attention) with backend="tpu": loss and every parameter
  gradient match the xla path. The model passes no `interpret`, so TPU interpret mode is forced
  around the trace."""
  from flax import nnx
  from jax.experimental.pallas import tpu as pltpu

  from lineax_lm.models.hybrid import HybridLM
  from pallas_kernels.common.tpu.state_kernel import interpret_params
  from tests.lineax_lm.tiny import tiny_config, tokens

  x = jnp.asarray(tokens((2, 21), seed=5))

  def loss_and_grads(backend):
    model = HybridLM(tiny_config("gated_deltanet", attn_ratio="1:1", backend=backend), nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
      logits = nnx.merge(graphdef, params, rest)(x[:, :-1])
      logp = jax.nn.log_softmax(logits.astype(jnp.float32))
      return -jnp.mean(jnp.take_along_axis(logp, x[:, 1:, None], axis=-1))

    return jax.jit(jax.value_and_grad(loss))(params)

  with pltpu.force_tpu_interpret_mode(interpret_params(True)):
    loss_tpu, grads_tpu = loss_and_grads("tpu")
  loss_xla, grads_xla = loss_and_grads("xla")
  assert abs(float(loss_tpu) - float(loss_xla)) < 1e-5 * abs(float(loss_xla))
  errors = jax.tree_util.tree_map(harness.rel_rms, grads_tpu, grads_xla)
  bad = {jax.tree_util.keystr(k): e for k, e in jax.tree_util.tree_leaves_with_path(errors) if not e < 1e-4}
  assert not bad, bad
