"""The correctness harness every op family (and every backend) is tested with.

An `OpCase` says how to draw inputs for one family; `check_op` runs a backend of the public op and the
float32 reference on the same inputs (bf16 inputs upcast, so input rounding is not counted), and
compares the output, the final state and the gradients of every input and of the initial state by
relative RMS error with the tolerances of DESIGN.md.

The suites at the end hold the tests every family runs on its xla path: `FamilySuite`, and for the
additive families (linear attention, retention, simple GLA, GLA, RWKV-6) `AdditiveSuite` and
`GatedSuite`. A suite's shape matrix is its `SHAPES`: the full `SHAPE_CASES` for the families whose
chunked core is their own (GLA, simple GLA, the gated delta rule, HGRN, mLSTM), and
`REDUCED_SHAPE_CASES` for those that only re-route to another family's core (linear attention and
retention -> simple GLA -> GLA; RWKV-6 -> GLA; the delta rule and KDA -> the gated delta rule). The
core's full matrix already covers the chunking, padding and dtype paths they share; the reduced one
checks the re-routing itself (argument mapping, gates, scale, output dtype) at a few shapes, and
those families keep every other test (varlen, decode continuation, gates, bad inputs, float64).
Tests marked `slow` (property tests here) are left out of `make test-fast`, never out of `make test`.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

F32 = jnp.float32
tree_map = jax.tree_util.tree_map

# Shape matrix of the foundation issue, covered pairwise: every T with both dtypes, and H, K, V
# cycling so each value of each appears with several T.
TS = (1, 15, 63, 64, 65, 300)
HKV = ((1, 16, 16), (3, 64, 100), (1, 100, 64), (3, 16, 64), (1, 64, 16), (3, 100, 100))
DTYPES = ("float32", "bfloat16")
SHAPE_CASES = [(T, *HKV[(i + j) % len(HKV)], dt) for i, T in enumerate(TS) for j, dt in enumerate(DTYPES)]
# Four of SHAPE_CASES for the families that re-route to a core tested on all of them (see the
# module docstring): one token, K != V both ways, K = 100 (padded) within and across a chunk
# boundary, both dtypes.
REDUCED_SHAPE_CASES = [(1, 1, 16, 16, "float32"), (15, 3, 64, 100, "float32"),
                       (15, 1, 100, 64, "bfloat16"), (65, 3, 100, 100, "bfloat16")]


def tolerance(dtype, what: str) -> float:
  """DESIGN.md: float32 < 1e-4 everywhere; bf16 o/state < 5e-3, grads < 1.5e-2, gate grads < 2e-2."""
  if jnp.dtype(dtype) == jnp.float32:
    return 1e-4
  return {"out": 5e-3, "grad": 1.5e-2, "gate_grad": 2e-2}[what]


def rel_rms(x, ref) -> float:
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  den = np.linalg.norm(ref.ravel())
  return float(np.linalg.norm((x - ref).ravel()) / max(den, 1e-30))


# Inputs are drawn with numpy (no per-shape XLA compiles for the random draws) and handed over as
# float32 jax arrays.
def normal(rng: np.random.Generator, *shape, scale=1.0, shift=0.0):
  return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale + shift)


def log_sigmoid(x):
  return jnp.asarray(-np.logaddexp(0.0, -np.asarray(x, np.float64)), F32)


def sigmoid(x):
  return jnp.asarray(1.0 / (1.0 + np.exp(-np.asarray(x, np.float64))), F32)


def unit(x):
  x = np.asarray(x)
  return jnp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True), F32)


@dataclasses.dataclass(frozen=True)
class OpCase:
  """One op family. `make_inputs(rng, B, T, H, K, V)` returns the op's positional inputs (float32) as
  an ordered dict; `make_state(rng, N, H, K, V)` an initial state (pytree of float32 arrays); `rng` is
  a numpy Generator. `out_shape(B, T, H, K, V)` gives the output's shape when it is not [B, T, H, V]
  (e.g. HGRN's [B, T, D])."""
  name: str
  chunk: Callable
  fused_recurrent: Callable
  make_inputs: Callable
  make_state: Callable
  gates: tuple = ()              # names of gate inputs (gate-gradient tolerance)
  float_inputs: tuple | None = None  # inputs cast to the test dtype (default: all but the gates)
  state_grad: bool = True        # whether the final state gets a cotangent / initial state a grad
  static_inputs: tuple = ()      # inputs without a time axis (e.g. RWKV-6's u [H, K])
  out_shape: Callable | None = None  # (B, T, H, K, V) -> the output's shape; default [B, T, H, V]
  scaled: bool = True            # whether the op takes `scale` (HGRN has none)

  def cast(self, inputs, dtype):
    names = self.float_inputs if self.float_inputs is not None else tuple(n for n in inputs if n not in self.gates)
    return {n: x.astype(dtype) if n in names else x for n, x in inputs.items()}


# check_op passes this multiple of the default K ** -0.5 as `scale`, to both sides: a backend (or a
# front door) that drops the caller's scale and uses the default fails every check.
SCALE_FACTOR = 0.8


def scale_kwargs(case: OpCase, K: int) -> dict:
  """The `scale` keyword check_op gives `case` (none for an op without one)."""
  return dict(scale=SCALE_FACTOR * K ** -0.5) if case.scaled else {}


def paired_leaves(got, want, what: str):
  """The leaves of two state pytrees, paired after asserting that they have the same structure and
  leaf shapes (zip alone would silently compare a prefix)."""
  got_def, want_def = jax.tree_util.tree_structure(got), jax.tree_util.tree_structure(want)
  assert got_def == want_def, f"{what}: structure {got_def}, expected {want_def}"
  pairs = list(zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
  for i, (a, b) in enumerate(pairs):
    assert a.shape == b.shape, f"{what}[{i}]: shape {a.shape}, expected {b.shape}"
  return pairs


def seed_of(*parts) -> int:
  return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def random_cu_seqlens(rng, T: int, n: int):
  """n sequences (one of them empty when n > 2) packed into T tokens."""
  cuts = np.sort(rng.choice(np.arange(1, T), n - 1, replace=False))
  cu = np.concatenate([[0], cuts, [T]]).astype(np.int32)
  if n > 2:
    cu = np.insert(cu, 2, cu[1])  # an empty sequence
  return jnp.asarray(cu)


def run_op(case: OpCase, fn, inputs, state, cotangents, cu_seqlens, **kw):
  """(o, final_state) and the gradients of sum(o * do) + sum(S * dS) w.r.t. inputs and state."""
  names = list(inputs)  # jit sorts dict keys; keep the op's argument order

  def loss(inputs, state):
    o, S = fn(*(inputs[n] for n in names), initial_state=state, output_final_state=True, cu_seqlens=cu_seqlens, **kw)
    do, dS = cotangents
    val = jnp.sum(o.astype(F32) * do)
    if case.state_grad:
      val += sum(jnp.sum(s * c) for s, c in paired_leaves(S, dS, "final_state"))
    return val, (o, S)
  (_, (o, S)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(inputs, state)
  return o, S, grads


def check_op(case: OpCase, *, T, H, K, V, dtype, backend="xla", kind="chunk", B=2, varlen=False,
             interpret=False, seed=None):
  """Asserts that `backend` matches the float32 reference on o, final state and every gradient,
  both called with a non-default `scale` (scale_kwargs)."""
  dtype = jnp.dtype(dtype)
  rng = np.random.default_rng(seed if seed is not None else seed_of(case.name, T, H, K, V, str(dtype), backend, kind, varlen))
  cu = None
  if varlen:
    B = 1
    cu = random_cu_seqlens(rng, T, 4) if T >= 4 else jnp.array([0, T], jnp.int32)
  N = B if cu is None else cu.shape[0] - 1
  inputs = case.make_inputs(rng, B, T, H, K, V)
  state = case.make_state(rng, N, H, K, V)
  do = normal(rng, *(case.out_shape(B, T, H, K, V) if case.out_shape else (B, T, H, V)))
  dS = tree_map(lambda s: normal(rng, *s.shape), state)  # the final state has the initial state's shape
  inputs = case.cast(inputs, dtype)  # the reference sees the same (rounded) values, upcast to float32
  scale = scale_kwargs(case, K)
  o_ref, S_ref, g_ref = run_op(case, getattr(case, kind), case.cast(inputs, F32), state, (do, dS), cu,
                               backend="reference", **scale)
  fn_kw = dict(backend=backend, interpret=interpret) if interpret else dict(backend=backend)
  fn_kw.update(scale)
  o, S, grads = run_op(case, getattr(case, kind), inputs, state, (do, dS), cu, **fn_kw)

  errors = {"o": (rel_rms(o, o_ref), tolerance(dtype, "out"))}
  assert o.dtype == dtype, f"o has dtype {o.dtype}, expected the input dtype {dtype}"
  assert o.shape == o_ref.shape, f"o has shape {o.shape}, expected {o_ref.shape}"
  paired_leaves(S_ref, state, "reference final_state vs initial_state")
  for i, (s, r) in enumerate(paired_leaves(S, S_ref, "final_state")):
    errors[f"final_state[{i}]"] = (rel_rms(s, r), tolerance(dtype, "out"))
  g_in, g_state = grads
  _, g_state_ref = g_ref
  for name in inputs:
    what = "gate_grad" if name in case.gates else "grad"
    assert g_in[name].shape == inputs[name].shape, f"d{name} has shape {g_in[name].shape}"
    errors[f"d{name}"] = (rel_rms(g_in[name], g_ref[0][name]), tolerance(dtype, what))
  if case.state_grad:
    for i, (s, r) in enumerate(paired_leaves(g_state, g_state_ref, "d_initial_state")):
      errors[f"d_initial_state[{i}]"] = (rel_rms(s, r), tolerance(dtype, "grad"))
  bad = {n: e for n, e in errors.items() if not e[0] < e[1]}  # NaN fails too
  assert not bad, f"{case.name}/{backend}/{kind} T={T} H={H} K={K} V={V} {dtype}: {bad}"
  return errors


def check_decode_continuation(case: OpCase, *, T=100, split=70, H=2, K=32, V=32, dtype="float32",
                              backend="xla", interpret=False):
  """The decode contract: chunk on a prefix, then fused_recurrent token by token from its final
  state, equals one long run."""
  rng = np.random.default_rng(seed_of(case.name, "decode", backend))
  inputs = case.cast(case.make_inputs(rng, 2, T, H, K, V), jnp.dtype(dtype))
  state = case.make_state(rng, 2, H, K, V)
  kw = dict(backend=backend, interpret=interpret) if interpret else dict(backend=backend)
  o_full, S_full = case.chunk(*inputs.values(), initial_state=state, output_final_state=True, **kw)
  head = {n: x if n in case.static_inputs else x[:, :split] for n, x in inputs.items()}
  o_head, S = case.chunk(*head.values(), initial_state=state, output_final_state=True, **kw)
  outs = [o_head]
  step = jax.jit(lambda xs, S: case.fused_recurrent(*xs, initial_state=S, output_final_state=True, **kw))
  for t in range(split, T):
    o_t, S = step(tuple(x if n in case.static_inputs else x[:, t:t + 1] for n, x in inputs.items()), S)
    outs.append(o_t)
  o_steps = jnp.concatenate(outs, axis=1)
  tol = tolerance(dtype, "out")
  assert rel_rms(o_steps, o_full) < tol, rel_rms(o_steps, o_full)
  for a, b in paired_leaves(S, S_full, "decoded final_state"):
    assert rel_rms(a, b) < tol, rel_rms(a, b)


def check_decode_vjp_matches_chunk(case: OpCase, *, backend="gpu", interpret=False, tol=1e-5):
  """A decode kernel whose backward is `jax.vjp` of the float32 reference (common/gpu/
  fused_recurrent.py, gla/gpu.py's recurrent) passes check_op by comparing the reference with
  itself; here its gradients must equal the chunked kernels' own backward on the same inputs
  (H = 2 with distinct gates, a non-default scale, varlen with two sequences)."""
  rng = np.random.default_rng(seed_of("decode-vjp", case.name, backend))
  T, H, K, V = 40, 2, 16, 16
  x = case.make_inputs(rng, 1, T, H, K, V)
  cu = jnp.asarray([0, 15, T], jnp.int32)
  h0 = case.make_state(rng, 2, H, K, V)
  do = normal(rng, 1, T, H, V)
  dS = jax.tree_util.tree_map(lambda s: normal(rng, *s.shape), h0)  # mLSTM's state is a tuple
  kw = dict(backend=backend, interpret=interpret) if interpret else dict(backend=backend)

  def grads(op):
    def loss(xs, h):
      o, S = op(*xs, initial_state=h, output_final_state=True, cu_seqlens=cu, scale=0.3, **kw)
      return jnp.sum(o.astype(F32) * do) + sum(
          jnp.sum(s * c) for s, c in paired_leaves(S, dS, "final_state"))
    return jax.jit(jax.grad(loss, argnums=(0, 1)))(tuple(x.values()), h0)

  (got, got_h0), (want, want_h0) = grads(case.fused_recurrent), grads(case.chunk)
  errors = {f"d{n}": rel_rms(a, b) for n, a, b in zip(x, got, want)}
  for i, (a, b) in enumerate(paired_leaves(got_h0, want_h0, "d_initial_state")):
    errors[f"d_initial_state[{i}]"] = rel_rms(a, b)
  assert all(e < tol for e in errors.values()), errors


def check_varlen_matches_loop(case: OpCase, *, T=200, H=2, K=32, V=32, backend="xla", interpret=False):
  """Packed varlen equals running each sequence on its own with its own initial state."""
  rng = np.random.default_rng(seed_of(case.name, "varlen-loop", backend))
  cu = random_cu_seqlens(rng, T, 4)
  N = cu.shape[0] - 1
  inputs = case.make_inputs(rng, 1, T, H, K, V)
  state = case.make_state(rng, N, H, K, V)
  kw = dict(backend=backend, interpret=interpret) if interpret else dict(backend=backend)
  o, S = jax.jit(lambda xs, s: case.chunk(*xs, initial_state=s, output_final_state=True, cu_seqlens=cu, **kw))(
      tuple(inputs.values()), state)
  cu_np = np.asarray(cu)
  for n in range(N):
    a, b = int(cu_np[n]), int(cu_np[n + 1])
    s_n = tree_map(lambda s: s[n:n + 1], state)
    if a == b:
      for x, y in paired_leaves(tree_map(lambda s: s[n:n + 1], S), s_n, f"final_state of sequence {n}"):
        np.testing.assert_array_equal(x, y)
      continue
    seq = {m: x if m in case.static_inputs else x[:, a:b] for m, x in inputs.items()}
    o_n, S_n = jax.jit(lambda xs, s: case.chunk(*xs, initial_state=s, output_final_state=True, **kw))(
        tuple(seq.values()), s_n)
    assert rel_rms(o[:, a:b], o_n) < 1e-5
    for x, y in paired_leaves(tree_map(lambda s: s[n:n + 1], S), S_n, f"final_state of sequence {n}"):
      assert rel_rms(x, y) < 1e-5


def check_agreement(case: OpCase, B, T, H, K, V, tol=1e-4):
  """Jitted chunk op, xla against reference, float32, default initial state: shapes, dtypes, values."""
  inputs = case.make_inputs(np.random.default_rng(seed_of(case.name, B, T, H, K, V)), B, T, H, K, V)
  run = jax.jit(lambda xs, backend: case.chunk(*xs, output_final_state=True, backend=backend),
                static_argnums=1)
  (o, S), (o_ref, S_ref) = run(tuple(inputs.values()), "xla"), run(tuple(inputs.values()), "reference")
  assert o.shape == (case.out_shape(B, T, H, K, V) if case.out_shape else (B, T, H, V))
  leaves = jax.tree_util.tree_leaves(S)
  state = jax.tree_util.tree_leaves(case.make_state(np.random.default_rng(0), B, H, K, V))
  assert [s.shape for s in leaves] == [s.shape for s in state] and all(s.dtype == F32 for s in leaves)
  assert rel_rms(o, o_ref) < tol
  assert all(rel_rms(s, r) < tol for s, r in paired_leaves(S, S_ref, "final_state"))


def recurrence_float64(q, k, v, g, u, h0, scale):
  """The additive recurrence in float64 numpy, written from DESIGN.md. g broadcasts to [B, T, H, K]
  (log decays); u None or [H, K] (RWKV-6: o_t reads S_{t-1} plus the bonus). Returns (o, S)."""
  q, k, v, h0 = (np.asarray(x, np.float64) for x in (q, k, v, h0))
  g = np.broadcast_to(np.asarray(g, np.float64), q.shape)
  S, outs = h0, []
  for t in range(q.shape[1]):
    kv = k[:, t, :, :, None] * v[:, t, :, None, :]
    S_next = S * np.exp(g[:, t])[..., None] + kv
    read = S_next if u is None else S + np.asarray(u, np.float64)[..., None] * kv
    outs.append(np.einsum("bhkv,bhk->bhv", read, scale * q[:, t]))
    S = S_next
  return np.stack(outs, 1), S


# --- the suites ----------------------------------------------------------------------------------

class FamilySuite:
  """The tests every op family runs on its xla path: subclass it in the family's test file as
  `class TestXla(harness.FamilySuite): CASE = <the family's OpCase>`, with
  `SHAPES = harness.REDUCED_SHAPE_CASES` when the family re-routes to another family's core."""
  CASE: OpCase
  SHAPES: list = SHAPE_CASES

  def pytest_generate_tests(self, metafunc):
    """Parametrizes the shape-matrix test over the subclass's SHAPES (a decorator on this class
    could not see them)."""
    if metafunc.function.__name__ == "test_xla_matches_reference":
      metafunc.parametrize(*self.shape_params())

  def shape_params(self):
    return "T,H,K,V,dtype", self.SHAPES

  def test_xla_matches_reference(self, T, H, K, V, dtype):
    check_op(self.CASE, T=T, H=H, K=K, V=V, dtype=dtype)

  @pytest.mark.parametrize("dtype", DTYPES)
  def test_varlen_against_reference(self, dtype):
    check_op(self.CASE, T=300, H=2, K=64, V=32, dtype=dtype, varlen=True)

  def test_varlen_equals_per_sequence_loop(self):
    check_varlen_matches_loop(self.CASE)

  def test_chunk_then_fused_recurrent_decode(self):
    check_decode_continuation(self.CASE)

  # differing_executors: every family's subclass runs this one inherited test, several in one process.
  @pytest.mark.slow
  @settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.differing_executors])
  @given(B=st.integers(1, 2), T=st.integers(1, 140), H=st.integers(1, 3), K=st.sampled_from([8, 16, 24]),
         V=st.integers(1, 20))
  def test_property_shapes_and_agreement(self, B, T, H, K, V):
    check_agreement(self.CASE, B, T, H, K, V)


class AdditiveSuite(FamilySuite):
  """FamilySuite for the additive families, with several cases: subclasses set CASES (OpCase
  objects; the shape matrix and the varlen test cycle through them, the other tests use
  CASE = CASES[0]) and `float64(inputs) -> (q, k, v, g, u)`, the recurrence_float64 arguments of
  CASE's inputs."""
  CASES: tuple = ()
  CASE = property(lambda self: self.CASES[0])

  @staticmethod
  def float64(inputs):
    raise NotImplementedError

  def shape_params(self):
    return "i,T,H,K,V,dtype", [(i, *c) for i, c in enumerate(self.SHAPES)]

  def test_xla_matches_reference(self, i, T, H, K, V, dtype):
    check_op(self.CASES[i % len(self.CASES)], T=T, H=H, K=K, V=V, dtype=dtype)

  @pytest.mark.parametrize("i,dtype", list(enumerate(DTYPES)))
  def test_varlen_against_reference(self, i, dtype):
    check_op(self.CASES[i % len(self.CASES)], T=300, H=2, K=64, V=32, dtype=dtype, varlen=True)

  def test_reference_matches_independent_float64_recurrence(self):
    B, T, H, K, V = 2, 150, 2, 32, 24
    rng = np.random.default_rng(2026)
    case = self.CASE
    inputs = case.make_inputs(rng, B, T, H, K, V)
    h0 = case.make_state(rng, B, H, K, V)
    o64, S64 = recurrence_float64(*self.float64(inputs), h0, K ** -0.5)
    # The reference is the definition the other tests hold every backend to: check it independently.
    o, S = jax.jit(lambda xs, h: case.chunk(*xs, initial_state=h, output_final_state=True,
                                             backend="reference"))(tuple(inputs.values()), h0)
    errs = (rel_rms(o, o64), rel_rms(S, S64))
    assert max(errs) < 1e-5, errs

  def test_bad_inputs_raise_clear_errors(self):
    case = self.CASE
    x = case.make_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
    first, *others = x
    with pytest.raises(ValueError, match=f"`{first}` must have rank 4"):
      case.chunk(*dict(x, **{first: x[first][0]}).values())
    for name in others:  # drop one head (or key channel) from one input: the error names it
      bad = jnp.delete(x[name], 0, axis=min(x[name].ndim - 1, 2))
      with pytest.raises(ValueError, match=f"`{name}` must have shape"):
        case.chunk(*dict(x, **{name: bad}).values())
    with pytest.raises(ValueError, match="`backend` must be one of"):
      case.chunk(*x.values(), backend="cuda")
    with pytest.raises(ValueError, match="must end at the packed length"):
      case.chunk(*x.values(), cu_seqlens=jnp.array([0, 5, 15], jnp.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
      case.chunk(*x.values(), cu_seqlens=jnp.array([0, 9, 5, 16], jnp.int32))
    two = case.make_inputs(np.random.default_rng(0), 2, 16, 2, 8, 8)
    with pytest.raises(ValueError, match="B == 1"):
      case.chunk(*two.values(), cu_seqlens=jnp.array([0, 16], jnp.int32))
    with pytest.raises(ValueError, match="`initial_state` must have shape"):
      case.chunk(*x.values(), initial_state=jnp.zeros((2, 2, 8, 8)))


class GatedSuite(AdditiveSuite):
  """AdditiveSuite plus the tests of families with log-decay gate inputs (CASE.gates; its
  `make_inputs` takes a `gate_scale` keyword)."""

  @pytest.mark.parametrize("gate_scale", [0.01, 10.0])
  def test_extreme_gates(self, gate_scale):
    case = self.CASE
    case = dataclasses.replace(case, make_inputs=functools.partial(case.make_inputs,
                                                                   gate_scale=gate_scale))
    check_op(case, T=130, H=2, K=32, V=32, dtype="float32")

  def test_positive_gates_raise(self):
    case = self.CASE
    x = case.make_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
    for name in case.gates:
      with pytest.raises(ValueError, match=f"`{name}` holds natural-log decays"):
        case.chunk(*dict(x, **{name: jnp.abs(x[name]) + 0.5}).values())

  def test_positive_gates_are_clamped_under_jit(self):
    case = self.CASE
    x = case.make_inputs(np.random.default_rng(0), 1, 16, 2, 8, 8)
    run = jax.jit(lambda xs: case.chunk(*xs)[0])
    o = run(tuple((jnp.abs(a) if n in case.gates else a) for n, a in x.items()))
    o0 = run(tuple((jnp.zeros_like(a) if n in case.gates else a) for n, a in x.items()))
    np.testing.assert_allclose(o, o0, rtol=1e-6, atol=1e-6)


class DeviceSuite:
  """The correctness matrix of a family's Pallas kernels on their device (compiled, no interpret
  mode): subclass it with CASE (and BACKEND) under `@pytest.mark.gpu` in the kernel's test file."""
  CASE: OpCase
  BACKEND = "gpu"

  @pytest.mark.parametrize("T,H,K,V,dtype", SHAPE_CASES)
  def test_chunk(self, T, H, K, V, dtype):
    check_op(self.CASE, T=T, H=H, K=K, V=V, dtype=dtype, backend=self.BACKEND)

  @pytest.mark.parametrize("dtype", DTYPES)
  def test_varlen(self, dtype):
    check_op(self.CASE, T=300, H=2, K=64, V=32, dtype=dtype, backend=self.BACKEND, varlen=True)

  def test_varlen_equals_loop(self):
    check_varlen_matches_loop(self.CASE, backend=self.BACKEND)

  @pytest.mark.parametrize("K,V", [(128, 128), (64, 256)])
  def test_bf16_long(self, K, V):
    check_op(self.CASE, T=4096, H=2, K=K, V=V, dtype="bfloat16", backend=self.BACKEND, B=1)


def triton_kernel_count(f, *args) -> int:
  """How many Triton kernels `jit(f)(*args)` launches when lowered for CUDA (no GPU needed): proves
  a GPU kernel lowers through Pallas' Triton path on a CPU host, and that no stage fell back to XLA."""
  from pallas_kernels import gpu_aot
  return len(gpu_aot.triton_kernels(f, *args))
