"""pallas_kernels.gpu_aot on a CPU host: the Triton kernels of an op lowered for CUDA, with the
launch parameters the kernels ask for, and the sm_90 limits a compiled kernel is judged by."""
from pallas_kernels import gpu_aot
from pallas_kernels.common.gpu.config import Config


def test_gated_delta_rule_kernels_and_their_launch_parameters():
  kernels = gpu_aot.op_kernels("gated_delta_rule", 1, 128, 2, 64, 64, config=Config(warps_wy_bwd=4))
  names = [k.name for k in kernels]
  # at K <= 128 the forward's output comes from its state pass (common.gpu.config.split_output)
  # and P^T do from the dh pass (split_dv_local)
  assert names == ["_wy_fwd_kernel", "_state_kernel", "_state_kernel", "_dh_kernel", "_dqk_kernel",
                   "_bwd_wy_kernel"], names
  by_name = {k.name: k for k in kernels}
  assert by_name["_bwd_wy_kernel"].num_warps == 4
  assert by_name["_wy_fwd_kernel"].num_warps == Config().warps_wy
  assert all(k.ttir.startswith(f"module @{k.name}") and "tt.func" in k.ttir for k in kernels)
  split = gpu_aot.op_kernels("gated_delta_rule", 1, 128, 2, 64, 64, config=Config(split_dv_local=True))
  assert [k.name for k in split][3:5] == ["_dv_local_kernel", "_dh_kernel"]


def test_limits():
  row = dict(shared=185 * 1024, spill_stores=0)
  assert gpu_aot.over_limits(row) == []
  assert gpu_aot.over_limits({**row, "shared": 265 * 1024}) == ["shared 265 KiB > 227 KiB"]
  assert gpu_aot.over_limits({**row, "spill_stores": 8}) == ["8 bytes of spill stores"]
