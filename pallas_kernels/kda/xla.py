"""Chunked KDA in pure JAX: the gated delta rule's WY/UT chunked path, which takes a per-channel g
[B, T, H, K] (decayed scores from `common.chunk.gated_scores`, overflow-free for any gate magnitude).

`chunk_kda(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None, chunk_size=64)` returns
(o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32).
"""
from pallas_kernels.gated_delta_rule.xla import chunk_gated_delta_rule as chunk_kda  # noqa: F401
from pallas_kernels.kda.reference import fused_recurrent_kda  # noqa: F401
