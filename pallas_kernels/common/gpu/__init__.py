"""Family-free pieces of the Pallas GPU kernels (Triton lowering), named by the stage they compute.

House rule: a family folder (`pallas_kernels/<family>/gpu.py`) holds every `custom_vjp` and every
kernel of its own math (the delta rule's WY/UT transform lives in gated_delta_rule/gpu.py); this
package holds only pieces that know no family, named by what they compute (like fla's
`fla/ops/common/chunk_h.py`, `chunk_o.py`), never by a family. A stage takes a family's optional
extras as optional arguments (the delta rule's w and v' are one more matmul in the shared state
loop, as in fla's common chunk_delta_h). A family composes the stages in its own custom_vjp and
enters through `layout.run_chunked`.

Modules:
- `config`          the tile/launch `Config` and the `Static` arguments every stage carries;
- `layout`          host-side plumbing: compiler params and `launch`, power-of-two padding, the
                    head-major gate layout [B, H, T], chunk-local cumsums, the BlockSpec factory
                    `Specs`, the limits (`unsupported`) and the input prologue `run_chunked`
                    (padding, varlen re-packing);
- `kernel_math`     in-kernel math: 2-D dots with a float32 accumulator, causal masks and decays,
                    row scaling, the value-tile loop of the chunk kernels, the 16 x 16-block
                    unit-lower inverse;
- `levels`          the intra-chunk pairs by levels, the per-channel score kernels' decays with no
                    positive exponent (GLA / RWKV-6 and KDA);
Stages:
- `chunk_state`     forward state pass: chunk-start states h or the output o and the final state;
- `chunk_o`         chunk-parallel output from the states h (scalar gates; the forward above K = 128);
- `chunk_dh`        reverse state-gradient pass: dh per chunk, dv', d initial_state;
- `chunk_dqk`       chunk-parallel dq, dk, dG (and dw for the delta rule);
- `fused_recurrent` the token-by-token decode kernel with a reference-recurrence gradient.
Every stage takes scalar gates (G [C] per chunk, head-major [B, H, T]) or per-channel gates (G
[C, K], token layout [B, T, H, K]: KDA), told apart by the gate array's rank, so the scalar families
compile to the same code; the per-channel path takes the intra-chunk scores (and q, k gated) from
the family's own sub-chunk kernel.

Triton lowering rules every stage follows: every loaded or stored block has power-of-two dims
(hence the padding of K and V); dots are 2-D with every dim >= 16; float32 x float32 dots are tf32
unless their precision is HIGHEST, which the float32-input paths use.
"""
