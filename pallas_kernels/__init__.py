"""Linear-attention token mixers as chunked ops with flash-linear-attention's API, on a pure-JAX path
that runs everywhere and Pallas kernels for GPU and TPU.

Every public op is importable from here, as from `fla.ops` (`from pallas_kernels import chunk_gla`),
and from its family module (`pallas_kernels.gla`). `pallas_kernels.common.dispatch.support_table()`
says which backend implements which op.
"""
from pallas_kernels.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
from pallas_kernels.gated_delta_rule import (chunk_gated_delta_rule, chunk_gdn,
                                             fused_recurrent_gated_delta_rule, fused_recurrent_gdn)
from pallas_kernels.gla import chunk_gla, fused_recurrent_gla
from pallas_kernels.hgrn import chunk_hgrn, fused_recurrent_hgrn
from pallas_kernels.kda import chunk_kda, fused_recurrent_kda
from pallas_kernels.linear_attn import chunk_linear_attn, fused_recurrent_linear_attn
from pallas_kernels.mlstm import chunk_mlstm, fused_recurrent_mlstm
from pallas_kernels.retention import chunk_retention, fused_recurrent_retention, retention_log_decay
from pallas_kernels.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6
from pallas_kernels.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

__version__ = "0.1.0"

__all__ = [
    "chunk_delta_rule", "fused_recurrent_delta_rule",
    "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_gdn", "fused_recurrent_gdn",
    "chunk_gla", "fused_recurrent_gla",
    "chunk_hgrn", "fused_recurrent_hgrn",
    "chunk_kda", "fused_recurrent_kda",
    "chunk_linear_attn", "fused_recurrent_linear_attn",
    "chunk_mlstm", "fused_recurrent_mlstm",
    "chunk_retention", "fused_recurrent_retention", "retention_log_decay",
    "chunk_rwkv6", "fused_recurrent_rwkv6",
    "chunk_simple_gla", "fused_recurrent_simple_gla",
]
