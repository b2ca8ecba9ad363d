"""mLSTM: the family suite on the full shape matrix, gate magnitudes, input gates of 1e4 against
float64, two steps by hand, bad inputs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_kernels.mlstm import chunk_mlstm, fused_recurrent_mlstm
from pallas_kernels.mlstm.tpu import value_block
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import MLSTM, mlstm_inputs, mlstm_state
from tests.pallas_kernels.test_float64 import directional_errors, mlstm64


class TestXla(harness.FamilySuite):
  CASE = MLSTM


@pytest.mark.parametrize("gate_scale,i_shift,f_shift", [(0.01, 0.0, 3.0), (3.0, -10.0, 3.0), (10.0, 0.0, 0.0)])
def test_gate_magnitudes(gate_scale, i_shift, f_shift):
  """Gate pre-activations from nearly constant (scale 0.01) through xLSTM's initialisation regime
  (input gates around -10) to scale 10 (input gates exp(+-30), forget gates down to exp(-30) per
  step, chunk cumsums of log f in the hundreds). At scale 10 the stabilizer exp(-m) is negligible, so
  o = C q / |n . q| is ill-conditioned where n . q nears 0: the chunked path sums log f over (s, t]
  directly instead of differencing cumsums, which keeps it within ~1e-5 of the reference there."""
  case = dataclasses.replace(MLSTM, make_inputs=lambda *a: mlstm_inputs(
      *a, gate_scale=gate_scale, i_shift=i_shift, f_shift=f_shift))
  harness.check_op(case, T=130, H=2, K=32, V=16, dtype="float32")


def _stabilizer_free_loss(o, state, cotangents, m_ref, exp):
  """sum(o do) + the final state's cotangents, with C and n taken in units of exp(-m_ref): C and n
  are the unstabilized state scaled by exp(-m), and at input gates of 1e4 m itself is only known to
  float32's spacing there (~1e-3), so C and n alone differ between exact paths by that factor."""
  do, (dC, dn, dm) = cotangents
  C, n, m = state
  rescale = exp(m - m_ref)
  return ((o * do).sum() + (C * rescale[..., None, None] * dC).sum() + (n * rescale[..., None] * dn).sum()
          + (m * dm).sum())


@pytest.mark.parametrize("backend", ["reference", "xla", pytest.param("tpu", marks=pytest.mark.slow),
                                     pytest.param("gpu", marks=pytest.mark.slow)])
@pytest.mark.parametrize("i_shift", [1e4, -1e4])
def test_input_gates_of_1e4_match_float64(i_shift, backend):
  """Input gates i ~ +-1e4 (so m ~ 1e4 where they dominate): outputs, final states and every
  gradient against the float64 recurrence within DESIGN.md's float32 tolerances. m carries the
  magnitude and float32 keeps only ~1e-3 of a number near 1e4, so every path differences the large
  terms (m, i) first and adds the small log f sums after; the outputs reach ~1e3 where n . q nears
  0, which amplifies any loss there. The final C and n are compared in units of the float64 m (see
  `_stabilizer_free_loss`)."""
  B, T, H, K, V, scale = 1, 130, 2, 16, 16, 0.2
  rng = np.random.default_rng(harness.seed_of("mlstm-1e4", i_shift))
  x = mlstm_inputs(rng, B, T, H, K, V, i_shift=i_shift)
  h0 = mlstm_state(rng, B, H, K, V)
  cts = (harness.normal(rng, B, T, H, V), mlstm_state(rng, B, H, K, V))
  names = list(x)
  interpret = dict(interpret=True) if backend in ("tpu", "gpu") else {}

  def loss(x, h0):
    o, S = chunk_mlstm(*(x[n] for n in names), scale=scale, initial_state=h0, output_final_state=True,
                       backend=backend, **interpret)
    return _stabilizer_free_loss(o, S, cts, lax.stop_gradient(S[2]), jnp.exp), (o, S)

  (_, (o, S)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, h0)
  f64 = lambda tree: jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)
  x64, h64, cts64, m32 = f64(x), f64(h0), f64(cts), np.asarray(S[2], np.float64)
  o64, (C64, n64, m64) = mlstm64(*(x64[n] for n in names), h64, scale)
  C, n, m = f64(S)
  errors = {"o": harness.rel_rms(o, o64), "m": harness.rel_rms(m, m64),
            "C": harness.rel_rms(C * np.exp(m - m64)[..., None, None], C64),
            "n": harness.rel_rms(n * np.exp(m - m64)[..., None], n64)}

  loss64 = lambda x, h: _stabilizer_free_loss(*mlstm64(*(x[n] for n in names), h, scale), cts64, m32, np.exp)
  # The initial state is forgotten at i ~ 1e4: its gradient is 0 on both sides (rel_rms: 0).
  errors.update(directional_errors(loss64, x64, h64, dict(grads[0], initial_state=grads[1]), rng))
  bad = {k: e for k, e in errors.items() if not e < harness.tolerance("float32", "grad")}
  assert not bad, f"{backend}, i ~ {i_shift}: errors against float64 {bad} (all: {errors})"


def test_definition_by_hand():
  """Two steps of mlstm_kernels' recurrent step in float64, from the default (zero) initial state."""
  rng = np.random.default_rng(5)
  x = mlstm_inputs(rng, 1, 2, 1, 4, 3)
  q, k, v, i, f = (np.asarray(a, np.float64)[0, :, 0] for a in x.values())
  C, n, m, outs = np.zeros((4, 3)), np.zeros(4), 0.0, []
  for t in range(2):
    logf = -np.logaddexp(0.0, -f[t])
    m_new = max(logf + m, i[t])
    C = np.exp(logf + m - m_new) * C + np.exp(i[t] - m_new) * np.outer(k[t], v[t])
    n = np.exp(logf + m - m_new) * n + np.exp(i[t] - m_new) * k[t]
    m, qs = m_new, q[t] / 2
    outs.append(C.T @ qs / (max(abs(n @ qs), np.exp(-m)) + 1e-6))
  run = jax.jit(lambda xs, backend: chunk_mlstm(*xs, output_final_state=True, backend=backend),
                static_argnums=1)
  for backend in ("xla", "reference"):
    o, (C_out, n_out, m_out) = run(tuple(x.values()), backend)
    np.testing.assert_allclose(o[0, :, 0], np.stack(outs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(C_out[0, 0], C, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n_out[0, 0], n, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m_out[0, 0], m, rtol=1e-6)


def test_tpu_value_tiles():
  """The TPU kernel keeps V whole up to a 512 x 512 state and splits larger ones into tiles of
  128-lane multiples that divide V."""
  assert [value_block(K, V) for K, V in [(128, 128), (512, 512), (256, 1024), (1024, 1024),
                                         (1024, 384), (2048, 2048), (1024, 100)]] == [
      128, 512, 1024, 256, 128, 128, 100]


def test_bad_inputs_raise_clear_errors():
  x = mlstm_inputs(np.random.default_rng(0), 1, 16, 2, 8, 4)
  q, k, v, i, f = x.values()
  state = mlstm_state(np.random.default_rng(1), 1, 2, 8, 4)
  with pytest.raises(ValueError, match="`k` must have shape"):
    chunk_mlstm(q, k[..., :4], v, i, f)
  with pytest.raises(ValueError, match="`i` must have rank 3"):
    chunk_mlstm(q, k, v, i[..., None], f)
  with pytest.raises(ValueError, match="`f` must have shape"):
    chunk_mlstm(q, k, v, i, f[:, :3])
  with pytest.raises(ValueError, match="`f` must be a floating-point array"):
    chunk_mlstm(q, k, v, i, f.astype(jnp.int32))
  with pytest.raises(ValueError, match="`initial_state` must be the tuple"):
    chunk_mlstm(*x.values(), initial_state=state[0])
  with pytest.raises(ValueError, match="`initial_state n` must have shape"):
    chunk_mlstm(*x.values(), initial_state=(state[0], state[1][..., :2], state[2]))
  with pytest.raises(ValueError, match="`initial_state m` must have rank 2"):
    fused_recurrent_mlstm(*x.values(), initial_state=(state[0], state[1], state[2][..., None]))
  with pytest.raises(ValueError, match="`backend` must be one of"):
    chunk_mlstm(*x.values(), backend="cuda")
  with pytest.raises(ValueError, match="must start at 0"):
    chunk_mlstm(*x.values(), cu_seqlens=jnp.array([1, 16], jnp.int32))
