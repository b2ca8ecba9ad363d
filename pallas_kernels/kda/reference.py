"""KDA token by token in float32: the gated delta rule's definition, which takes a per-channel g.

  S_t = diag(exp(g_t)) S_{t-1};  u_t = beta_t (v_t - S_t^T k_t);  S_t += k_t u_t^T;  o_t = S_t^T (scale q_t)

`fused_recurrent_kda(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None)` with g
[B, T, H, K] returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
"""
from pallas_kernels.gated_delta_rule.reference import (  # noqa: F401
    chunk_gated_delta_rule as chunk_kda, fused_recurrent_gated_delta_rule as fused_recurrent_kda)
