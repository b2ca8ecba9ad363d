"""HGRN on TPU: the elementwise-recurrence Mosaic kernel of pallas_kernels/common/tpu_hgrn.py.
`interpret=True` runs it in TPU interpret mode on any host.

`chunk_hgrn(x, g, *, initial_state=None, cu_seqlens=None, interpret=False)` with x, g [B, T, D]
returns (o [B, T, D] in x.dtype, final_state [N, D] float32), exactly like xla.py.
"""
from pallas_kernels.common.tpu_hgrn import chunk_hgrn  # noqa: F401
