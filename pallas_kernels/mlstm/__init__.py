"""xLSTM's mLSTM: `chunk_mlstm`, `fused_recurrent_mlstm` (mirroring mlstm_kernels' chunkwise and
recurrent mLSTM in fla's layout)."""
from __future__ import annotations

from pallas_kernels.common import api
from pallas_kernels.mlstm.reference import EPS
from pallas_kernels.mlstm.transition import TRANSITION

STATE = api.State(("[N, H, K, V]", "[N, H, K]", "[N, H]"), names=("C", "n", "m"))

_DOC = """mLSTM{kind}, with the max-stabilizer m (all gates and states in float32).

  logf_t = log_sigmoid(f_t);  m_t = max(logf_t + m_{t-1}, i_t)
  C_t = exp(logf_t + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
  n_t = exp(logf_t + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t
  o_t = C_t^T (scale q_t) / (max(|n_t . (scale q_t)|, exp(-m_t)) + EPS)

Mirrors mlstm_kernels' mLSTM (`mlstm_chunkwise__xl_chunk`, `mlstm_recurrent_sequence__native_fw`)
with EPS = {eps} and a zero default initial state (C = 0, n = 0, m = 0), in the layout [B, T, H, .].

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  i: [B, T, H] input-gate pre-activations (exponential input gate exp(i)).
  f: [B, T, H] forget-gate pre-activations (sigmoid forget gate, taken in log space).
""".replace("{eps}", str(EPS))


def _run(kind, q, k, v, i, f, scale, initial_state, output_final_state, cu_seqlens, backend,
         interpret, context_axis):
  d = api.dims(q, k, v, cu_seqlens, context_axis=context_axis)
  i, f = api.gate("i", i, d, "[B, T, H]"), api.gate("f", f, d, "[B, T, H]")
  return api.run("mlstm", kind, d, (q, k, v, i, f), state=STATE, scale=scale,
                 initial_state=initial_state, output_final_state=output_final_state,
                 cu_seqlens=cu_seqlens, backend=backend, interpret=interpret, context_axis=context_axis,
                 transition=TRANSITION)


def chunk_mlstm(q, k, v, i, f, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                *, backend="auto", interpret=False, context_axis=None):
  return _run("chunk", q, k, v, i, f, scale, initial_state, output_final_state, cu_seqlens, backend,
              interpret, context_axis)


def fused_recurrent_mlstm(q, k, v, i, f, scale=None, initial_state=None, output_final_state=False,
                          cu_seqlens=None, *, backend="auto", interpret=False, context_axis=None):
  return _run("fused_recurrent", q, k, v, i, f, scale, initial_state, output_final_state, cu_seqlens,
              backend, interpret, context_axis)


api.document(_DOC, state=STATE, chunk=chunk_mlstm, fused_recurrent=fused_recurrent_mlstm)
