"""xLSTM's mLSTM: `chunk_mlstm`, `fused_recurrent_mlstm` (mirroring mlstm_kernels' chunkwise and
recurrent mLSTM in fla's layout)."""
from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.common import checks, dispatch
from pallas_kernels.mlstm.reference import EPS

_DOC = """mLSTM{kind_doc}, with the max-stabilizer m (all gates and states in float32).

  logf_t = log_sigmoid(f_t);  m_t = max(logf_t + m_{{t-1}}, i_t)
  C_t = exp(logf_t + m_{{t-1}} - m_t) C_{{t-1}} + exp(i_t - m_t) k_t v_t^T
  n_t = exp(logf_t + m_{{t-1}} - m_t) n_{{t-1}} + exp(i_t - m_t) k_t
  o_t = C_t^T (scale q_t) / (max(|n_t . (scale q_t)|, exp(-m_t)) + {eps})

Mirrors mlstm_kernels' mLSTM (`mlstm_chunkwise__xl_chunk`, `mlstm_recurrent_sequence__native_fw`)
with eps = {eps} and a zero default initial state (C = 0, n = 0, m = 0), in the layout [B, T, H, .].

Args:
  q, k: [B, T, H, K]. v: [B, T, H, V].
  i: [B, T, H] input-gate pre-activations (exponential input gate exp(i)).
  f: [B, T, H] forget-gate pre-activations (sigmoid forget gate, taken in log space).
  scale: query scale, default K ** -0.5.
  initial_state: the tuple (C [N, H, K, V], n [N, H, K], m [N, H]) (N = B, or the number of sequences
    with cu_seqlens); default zeros.
  output_final_state: return the float32 final state (C, n, m) instead of None.
  cu_seqlens: int32 [N + 1] offsets of packed sequences (B == 1); the state resets at each boundary.
  backend: "auto" | "reference" | "xla" | "gpu" | "tpu".  interpret: run a Pallas kernel interpreted.
Returns:
  (o [B, T, H, V] in q.dtype, (C [N, H, K, V], n [N, H, K], m [N, H]) float32 or None).
"""

_STATE = (("C", "[N, H, K, V]"), ("n", "[N, H, K]"), ("m", "[N, H]"))


def _run(kind, q, k, v, i, f, scale, initial_state, output_final_state, cu_seqlens, backend, interpret):
  B, T, H, K, V = checks.check_qkv(q, k, v)
  for name, gate in (("i", i), ("f", f)):
    checks.check_rank(name, gate, 3, "[B, T, H]")
    checks.check_shape(name, gate, (B, T, H), "[B, T, H]")
    if not jnp.issubdtype(gate.dtype, jnp.floating):
      raise ValueError(f"`{name}` must be a floating-point array; got dtype {gate.dtype}")
  N = checks.num_sequences(B, T, cu_seqlens)
  if initial_state is not None:
    if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 3:
      raise ValueError("`initial_state` must be the tuple (C [N, H, K, V], n [N, H, K], m [N, H]); "
                       f"got {type(initial_state).__name__}")
    for (name, layout), s, shape in zip(_STATE, initial_state, ((N, H, K, V), (N, H, K), (N, H))):
      checks.check_state(f"initial_state {name}", s, shape, layout)
    initial_state = tuple(initial_state)
  fn = dispatch.resolve("mlstm", kind, backend, interpret)
  o, state = fn(q, k, v, i, f, scale=K ** -0.5 if scale is None else scale,
                initial_state=initial_state, cu_seqlens=cu_seqlens)
  return o, state if output_final_state else None


def chunk_mlstm(q, k, v, i, f, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                backend="auto", interpret=False):
  return _run("chunk", q, k, v, i, f, scale, initial_state, output_final_state, cu_seqlens, backend,
              interpret)


def fused_recurrent_mlstm(q, k, v, i, f, scale=None, initial_state=None, output_final_state=False,
                          cu_seqlens=None, backend="auto", interpret=False):
  return _run("fused_recurrent", q, k, v, i, f, scale, initial_state, output_final_state, cu_seqlens,
              backend, interpret)


chunk_mlstm.__doc__ = _DOC.format(kind_doc=", chunked (training and prefill)", eps=EPS)
fused_recurrent_mlstm.__doc__ = _DOC.format(kind_doc=", token by token (decode)", eps=EPS)
