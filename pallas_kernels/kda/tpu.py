"""KDA on TPU: the delta-rule-class Mosaic kernel (pallas_kernels/gated_delta_rule/tpu.py) with a
per-channel gate g [B, T, H, K]; its decayed intra-chunk scores are overflow-free for any gate
magnitude (16-token sub-chunks, see common/tpu/chunk_math.Decay). `interpret=True` runs it in TPU
interpret mode on any host.

`chunk_kda(q, k, v, g, beta, *, scale, initial_state, cu_seqlens=None, interpret=False)`
returns (o [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32), exactly like xla.py.
"""
from pallas_kernels.gated_delta_rule.tpu import chunk_delta as chunk_kda  # noqa: F401
