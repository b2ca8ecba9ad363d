"""Context parallelism (`context_axis`): every op with T split over 2 or 4 of the suite's 8 fake CPU
devices inside `jax.shard_map` equals the same op unsharded, on the output, the final state (the
same on every device: out_specs P() type-checks that it is invariant over the axis) and the
gradients of every input and of the initial state.

The packing `CU` puts every case of a slice boundary in 64 tokens: a sequence inside a slice, an
empty one, one that ends on a slice's last token, one that crosses two (P = 4) or one (P = 2)
boundaries (so a slice holds nothing but its middle and has to pass the entering state on), and one
that starts on a slice's first token.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from pallas_kernels.common.segments import choose_segments, segment_parallel
from tests.pallas_kernels import cases, harness

pytestmark = pytest.mark.multi_device

F32 = jnp.float32
T, H, K, V = 64, 2, 16, 16
CU = np.array([0, 5, 5, 10, 48, 64], np.int32)  # slices of 16 (P = 4) or 32 (P = 2) tokens
AXIS = "context"

FAMILIES = {c.name: c for c in (cases.LINEAR_ATTN, cases.LINEAR_ATTN_NORMALIZED, cases.RETENTION,
                                cases.SIMPLE_GLA, cases.GLA, cases.RWKV6, cases.DELTA_RULE, cases.GDN,
                                cases.KDA, cases.HGRN, cases.MLSTM)}


def draw(case, varlen: bool, seed: int = 0):
  """Inputs, initial state and the cotangents of o and the final state (float32)."""
  rng = np.random.default_rng(harness.seed_of("context", case.name, varlen, seed))
  B = 1 if varlen else 2
  N = len(CU) - 1 if varlen else B
  inputs = case.make_inputs(rng, B, T, H, K, V)
  state = case.make_state(rng, N, H, K, V)
  do = harness.normal(rng, *(case.out_shape(B, T, H, K, V) if case.out_shape else (B, T, H, V)))
  dS = jax.tree_util.tree_map(lambda s: harness.normal(rng, *s.shape), state)
  return inputs, state, (do, dS)


def sharded(case, devices: int, names, **kw):
  """case.chunk with T split over `devices` devices: (inputs, state, cu) -> (o, final_state). A
  Pallas call has no shard_map type for its outputs, so a Pallas backend runs with check_vma=False
  (as lineax_lm.sharding runs every op call)."""
  mesh = Mesh(np.array(jax.devices()[:devices]), (AXIS,))
  specs = tuple(P() if n in case.static_inputs else P(None, AXIS) for n in names)

  def local(xs, state, cu):
    return case.chunk(*xs, initial_state=state, output_final_state=True, cu_seqlens=cu,
                      context_axis=AXIS, **kw)
  return jax.shard_map(local, mesh=mesh, in_specs=(specs, P(), P()), out_specs=(P(None, AXIS), P()),
                       check_vma=kw.get("backend") not in ("gpu", "tpu"))


def sliced(case, slices: int, names, **kw):
  """case.chunk over `slices` slices of T on one device, the slices as a `jax.vmap` axis named AXIS
  (which binds the axis as a mesh would): (inputs, state, cu) -> (o, final_state of slice 0), after
  asserting that every slice returns the same final state."""
  def split(x):  # [B, T, ...] -> [slices, B, T / slices, ...]
    return jnp.moveaxis(x.reshape(x.shape[0], slices, -1, *x.shape[2:]), 1, 0)

  def op(xs, state, cu):
    axes = tuple(None if n in case.static_inputs else 0 for n in names)
    xs = tuple(x if n in case.static_inputs else split(x) for n, x in zip(names, xs))
    o, S = jax.vmap(lambda xs, state, cu: case.chunk(*xs, initial_state=state, output_final_state=True,
                                                      cu_seqlens=cu, context_axis=AXIS, **kw),
                    in_axes=(axes, None, None), axis_name=AXIS)(xs, state, cu)
    o = jnp.moveaxis(o, 0, 1).reshape(o.shape[1], -1, *o.shape[3:])
    return o, jax.tree_util.tree_map(lambda s: s[0], S), S
  return op


def unsharded(case, **kw):
  return lambda xs, state, cu: case.chunk(*xs, initial_state=state, output_final_state=True,
                                          cu_seqlens=cu, **kw)


def outputs_and_grads(op, inputs, state, cotangents, cu):
  """(o, final_state) and the gradients of sum(o * do) + sum(S * dS) w.r.t. the inputs and state."""
  names = list(inputs)
  xs = tuple(inputs.values())

  def loss(xs, state):
    o, S = op(xs, state, cu)
    do, dS = cotangents
    return jnp.sum(o.astype(F32) * do) + sum(
        jnp.sum(s * c) for s, c in harness.paired_leaves(S, dS, "final_state")), (o, S)
  g, out = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(xs, state)
  return out, (dict(zip(names, g[0])), g[1])


def segmented(case, segments: int, names, **kw):
  """case.chunk on one device with T run as `segments` segments side by side (common.segments)."""
  def op(xs, state, cu):
    with segment_parallel(segments):
      return case.chunk(*xs, initial_state=state, output_final_state=True, cu_seqlens=cu, **kw)
  return op


def check_context_parallel(case, devices, varlen: bool, backend: str = "xla", split=sharded, **kw):
  """Asserts the op on `backend` sharded over each device count in `devices` (an int or a tuple)
  equals it unsharded (on the xla path for a Pallas backend), within the float32 tolerance of
  DESIGN.md. The unsharded program is compiled once for all device counts. `split=segmented`:
  the segments of one device instead of devices."""
  inputs, state, cotangents = draw(case, varlen)
  cu = jnp.asarray(CU) if varlen else None
  whole = unsharded(case, backend="xla" if backend in ("gpu", "tpu") else backend)
  (o_ref, S_ref), g_ref = outputs_and_grads(whole, inputs, state, cotangents, cu)
  tol = harness.tolerance(F32, "out")  # float32: 1e-4 on everything
  for n in (devices,) if isinstance(devices, int) else devices:
    (o, S), g = outputs_and_grads(split(case, n, list(inputs), backend=backend, **kw), inputs, state,
                                  cotangents, cu)
    errors = {"o": harness.rel_rms(o, o_ref)}
    for i, (a, b) in enumerate(harness.paired_leaves(S, S_ref, "final_state")):
      errors[f"final_state[{i}]"] = harness.rel_rms(a, b)
    for name in inputs:
      errors[f"d{name}"] = harness.rel_rms(g[0][name], g_ref[0][name])
    for i, (a, b) in enumerate(harness.paired_leaves(g[1], g_ref[1], "d_initial_state")):
      errors[f"d_initial_state[{i}]"] = harness.rel_rms(a, b)
    bad = {name: e for name, e in errors.items() if not e < tol}  # NaN fails too
    assert not bad, f"{case.name} over {n} devices, varlen={varlen}: {bad}"


# The cross-device program is the same whatever backend the op resolves to; what differs by family
# is its transition (each family's transition.py), and by layout the slice geometry (common/
# context.py: a batch of rows, or packed sequences with global offsets, sequences crossing one (2
# devices) or two (4 devices) slice boundaries). Every family runs on the float32 reference (the
# cheapest to compile) in all four layouts; the chunked xla path runs the K x K transition (extra
# value columns) and mLSTM's log space, a GPU kernel in interpret mode a decay a head.
@pytest.mark.slow  # 22 cases of three multi-device programs each
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "cu_seqlens"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_sharded_equals_unsharded(family, varlen):
  check_context_parallel(FAMILIES[family], (2, 4), varlen, backend="reference")


@pytest.mark.slow
@pytest.mark.parametrize("family,devices,varlen", [("gated_delta_rule", 4, True), ("mlstm", 2, False)])
def test_xla_path_sharded_equals_unsharded(family, devices, varlen):
  check_context_parallel(FAMILIES[family], devices, varlen, backend="xla")


@pytest.mark.slow
def test_gpu_kernel_sharded_equals_unsharded():
  """A Pallas GPU kernel (interpret mode) under the same cross-device program: retention, on the
  simple GLA kernels."""
  check_context_parallel(FAMILIES["retention"], 2, varlen=False, backend="gpu", interpret=True)


# Segment parallelism is the same program with the slices as a vmap axis of one device: every family
# on the reference in both layouts, at 4 segments (sequences crossing two boundaries); the chunked
# xla path as above, and in interpret mode GLA's GPU kernels and GDN's (the K x K transition as
# extra value columns of the vmapped kernels: the 340M GDN's path at B=1 and long T).
@pytest.mark.slow
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "cu_seqlens"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_in_segments_equals_whole(family, varlen):
  check_context_parallel(FAMILIES[family], 4, varlen, backend="reference", split=segmented)


@pytest.mark.slow
@pytest.mark.parametrize("family,backend,kw", [("gated_delta_rule", "xla", {}), ("mlstm", "xla", {}),
                                               ("gla", "gpu", {"interpret": True}),
                                               ("gated_delta_rule", "gpu", {"interpret": True})])
def test_backends_in_segments_equal_whole(family, backend, kw):
  check_context_parallel(FAMILIES[family], 2, True, backend=backend, split=segmented, **kw)


def test_mlstm_combine_keeps_float32_precision_at_input_gates_of_1e4():
  """mLSTM's log-space combine (transition.py) differences m's magnitude first: at input gates of
  1e4 (m ~ 1e4, where float32 keeps ~1e-3) exp(m + F - m') rounded F, and 4 segments were 1e-5 to
  8e-5 off the whole op even where the outputs are well conditioned (q, k >= 0 keep q . n away from
  0); now they agree to float32 rounding (measured <= 4e-7). The final C and n are compared in
  units of the whole op's m (m itself is float32: C and n inherit its rounding as a factor)."""
  def positive(*shape):
    x = cases.mlstm_inputs(*shape, i_shift=1e4)
    return dict(x, q=jnp.abs(x["q"]), k=jnp.abs(x["k"]))
  case = dataclasses.replace(cases.MLSTM, name="mlstm[i=1e4]", make_inputs=positive)
  inputs, state, cotangents = draw(case, varlen=False)
  (o, (C, n, m)), g = outputs_and_grads(segmented(case, 4, list(inputs), backend="xla"), inputs, state,
                                        cotangents, None)
  (o_ref, (C_ref, n_ref, m_ref)), g_ref = outputs_and_grads(unsharded(case, backend="xla"), inputs,
                                                            state, cotangents, None)
  units = np.exp(np.asarray(m, np.float64) - np.asarray(m_ref, np.float64))
  errors = {"o": harness.rel_rms(o, o_ref), "m": harness.rel_rms(m, m_ref),
            "C": harness.rel_rms(C * units[..., None, None], C_ref),
            "n": harness.rel_rms(n * units[..., None], n_ref)}
  errors.update({f"d{name}": harness.rel_rms(g[0][name], g_ref[0][name]) for name in inputs})
  bad = {name: e for name, e in errors.items() if not e < 2e-6}
  assert not bad, bad


def test_segment_count_fills_the_device_and_keeps_segments_long():
  assert choose_segments(1, 32768, 4, sms=132) == 16       # B x H = 4: 16 segments of 2,048
  assert choose_segments(1, 4096, 4, sms=132) == 4         # segments of at least 1,024 tokens
  assert choose_segments(8, 32768, 16, sms=132) == 2       # 128 programs: two waves at 2 segments
  assert choose_segments(32, 4096, 16, sms=132) == 1       # the batch fills the device
  assert choose_segments(1, 3000, 4, sms=132) == 1         # no whole 64-token chunks per segment
  x = cases.gla_inputs(np.random.default_rng(0), 1, 48, 2, 8, 8)
  with pytest.raises(ValueError, match="`segments=5` must divide the sequence length T = 48"):
    with segment_parallel(5):
      cases.GLA.chunk(*x.values())
  with pytest.raises(ValueError, match="positive int"):
    with segment_parallel(0):
      pass


def test_segments_save_no_float32_or_mask_activations_for_the_backward():
  """What the forward saves for the backward on 4 segments, beside the whole op's: the op's own
  residuals (bf16 here) on K extra value columns, the transition's query factor in bf16 and states
  [S, B, H, K, V]; no float32 copy of an activation, no broadcast mask, no zeros. At the 340M GDN's
  B=1 T=32k, K=256, V=512 the correction once saved 2.6x the whole op's residuals a layer, more
  than an 80 GiB GPU held over 24 layers."""
  B, T, H, K, V = 1, 4096, 2, 64, 128
  bf16 = jnp.bfloat16
  args = [jax.ShapeDtypeStruct((B, T, H, K), bf16)] * 2 + [
      jax.ShapeDtypeStruct((B, T, H, V), bf16), jax.ShapeDtypeStruct((B, T, H), jnp.float32),
      jax.ShapeDtypeStruct((B, T, H), bf16)]
  op = lambda *x: cases.GDN.chunk(*x, backend="gpu", interpret=True)[0]  # noqa: E731

  def residuals(segments):
    with segment_parallel(segments):
      saved = jax.tree_util.tree_leaves(jax.eval_shape(lambda *x: jax.vjp(op, *x)[1], *args))
    return [(leaf.dtype, int(np.prod(leaf.shape))) for leaf in saved]

  whole, segmented_ = residuals(1), residuals(4)
  large = [(d, n) for d, n in segmented_ if n >= B * T * H * K]
  assert all(d == bf16 for d, _ in large), large
  nbytes = lambda saved: sum(n * d.itemsize for d, n in saved)  # noqa: E731
  assert nbytes(segmented_) <= 1.8 * nbytes(whole), (nbytes(segmented_), nbytes(whole))


@pytest.mark.gpu
@pytest.mark.parametrize("family,varlen", [("gated_delta_rule", True), ("gla", False),
                                           ("simple_gla", True), ("hgrn", False)])
def test_gpu_kernels_over_slices_on_one_device(family, varlen):
  """The compiled GPU kernels under the cross-device program, its 4 slices as a vmap axis on the one
  device: equal to the unsharded kernels, and every slice returns the same final state."""
  case = FAMILIES[family]
  inputs, state, cotangents = draw(case, varlen)
  cu = jnp.asarray(CU) if varlen else None
  op = sliced(case, 4, list(inputs), backend="gpu")
  o, S, S_all = jax.jit(op)(tuple(inputs.values()), state, cu)
  o_ref, S_ref = jax.jit(unsharded(case, backend="gpu"))(tuple(inputs.values()), state, cu)
  tol = harness.tolerance(F32, "out")
  assert harness.rel_rms(o, o_ref) < tol
  for a, b in harness.paired_leaves(S, S_ref, "final_state"):
    assert harness.rel_rms(a, b) < tol
  for s in jax.tree_util.tree_leaves(S_all):
    np.testing.assert_array_equal(s, jnp.broadcast_to(s[:1], s.shape))
  (_, _), g = outputs_and_grads(lambda *a: op(*a)[:2], inputs, state, cotangents, cu)
  (_, _), g_ref = outputs_and_grads(unsharded(case, backend="gpu"), inputs, state, cotangents, cu)
  for name in inputs:
    assert harness.rel_rms(g[0][name], g_ref[0][name]) < tol, name
  for a, b in harness.paired_leaves(g[1], g_ref[1], "d_initial_state"):
    assert harness.rel_rms(a, b) < tol


def test_unbound_axis_and_unequal_slices_raise():
  x = cases.gla_inputs(np.random.default_rng(0), 1, 32, 2, 8, 8)
  with pytest.raises(ValueError, match="`context_axis='nope'` is not a bound mesh axis"):
    cases.GLA.chunk(*x.values(), context_axis="nope")
  mesh = Mesh(np.array(jax.devices()[:2]), (AXIS,))
  cu = np.array([0, 10, 16], np.int32)  # concrete, and ending at the local T = 16, not at 2 x 16
  op = jax.shard_map(lambda *xs: cases.GLA.chunk(*xs, cu_seqlens=cu, context_axis=AXIS)[0], mesh=mesh,
                     in_specs=P(None, AXIS), out_specs=P(None, AXIS))
  with pytest.raises(ValueError, match="must end at the whole length, 2 devices x the local T = 16"):
    jax.jit(op).trace(*x.values())
