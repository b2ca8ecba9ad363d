"""Family-free pieces of the Mosaic TPU kernels.

The house rule: a family folder (`pallas_kernels/<family>/tpu.py`) holds every `custom_vjp` and
kernel of its own math; this package holds only pieces that know no family, named by what they do,
never by a family. A family that serves others (GLA's additive kernel for simple GLA, retention,
linear attention and RWKV-6; the gated delta rule's for the delta rule and KDA) keeps its kernel in
its own `tpu.py`, and the others adapt onto it.

  layout        the chunk plan (padding or varlen re-packing, per-chunk sequence ids and reset
                flags) and the head-major [B, H, N*C, D] layout the kernels read
  state_kernel  the runner of every chunk kernel that carries a state across the chunk axis: a
                family writes its per-chunk forward and backward as a `StateKernel`, and `run`
                builds the BlockSpecs, the pallas_calls and the custom_vjp
  chunk_math    in-kernel building blocks on the 2-D values of one chunk of one head (matmuls,
                decayed intra-chunk scores, the unit-lower-triangular inverse, decayed prefix sums)
"""
