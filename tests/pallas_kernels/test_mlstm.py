"""mLSTM: the family suite on the full shape matrix, gate magnitudes, two steps by hand, bad
inputs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.mlstm import chunk_mlstm, fused_recurrent_mlstm
from tests.pallas_kernels import harness
from tests.pallas_kernels.cases import MLSTM, mlstm_inputs, mlstm_state


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
