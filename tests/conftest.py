"""Test setup: fake CPU devices (8 for the sharding tests), GPU tests only where a GPU is, TPU
compiles (`tpu_aot`) only where libtpu is installed."""
import importlib.metadata
import os
import shutil
import tempfile

# $LINEAX_LM_TEST_CPU_DEVICES fake CPU devices, default 8: the sharding tests (marker
# `multi_device`) need 8. `make test` runs the rest on one, in a pytest of its own: an SPMD program
# over 8 devices takes a third longer to compile, and nothing else in them depends on the device
# count. Compiling dominates the suite on CPU (the tests' programs are small), so two flags make it
# cheaper: LLVM optimisation off (halves it), and XLA's loop emitters instead of its fusion emitters
# (a further 3-5x less compile CPU per program, for a little more run time on the largest shapes).
# Results are equal to the last few float32 ulps (reduction order), far inside every tolerance. XLA
# aborts on a flag it does not know, and newer XLA retires the CPU's legacy emitters, so that flag is
# set only for the jaxlib series it was measured on (CI's 0.10); it changes nothing on a GPU host.
_flags = os.environ.get("XLA_FLAGS", "")
_CPU_DEVICES = int(os.environ.get("LINEAX_LM_TEST_CPU_DEVICES", "8"))
_new = [f"--xla_force_host_platform_device_count={_CPU_DEVICES}",
        "--xla_backend_optimization_level=0"]
if importlib.metadata.version("jaxlib").startswith("0.10."):
  _new.append("--xla_cpu_use_fusion_emitters=false")
for _flag in _new:
  if _flag.split("=")[0] not in _flags:
    _flags += " " + _flag
os.environ["XLA_FLAGS"] = _flags.strip()

# One persistent compilation cache per test run, shared by the xdist workers: many tests compile the
# same small programs (every Trainer of tiny_config, a resumed run's step, the subprocess CLIs), and
# a hit is a file read instead of an XLA compile. Programs that take 0.2 s or more to compile are
# written (jax's default is 1 s): a tiny model's parameter init and eval programs compile in 0.3 to
# 0.9 s and recur in most training tests (10% off tests/lineax_lm/train), while the eager ops'
# programs, the most numerous, stay unserialised. Entries are keyed on the program, the flags and
# the jax version, so a hit is the same executable; a fresh directory per run (removed at its end)
# keeps a run's timings those of a clean clone.
_OWNS_CACHE = "LINEAX_LM_TEST_JAX_CACHE" not in os.environ  # the controller; workers inherit it
os.environ.setdefault("LINEAX_LM_TEST_JAX_CACHE",
                      os.path.join(tempfile.gettempdir(), f"lineax_lm_tests_jax_cache_{os.getpid()}"))
_CACHE = os.environ["LINEAX_LM_TEST_JAX_CACHE"]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# On a GPU host each pytest-xdist worker is its own JAX process on the one GPU: uncapped, the first
# workers' allocators grow into memory the later ones need (out-of-memory and "failed to initialize
# BLASLT" errors at 8 workers). Each worker takes its share, 90% of the GPU over the workers; the
# variable means nothing to the CPU backend.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / _workers:.3f}")

import jax  # noqa: E402
import pytest  # noqa: E402

from lineax_lm.cli import cpu_without_accelerator  # noqa: E402

from pallas_kernels.tpu_aot import libtpu_missing  # noqa: E402

cpu_without_accelerator()  # libtpu installed for the `tpu_aot` tests, no TPU here: the CPU


def pytest_collection_modifyitems(config, items):
  # The `slow` tests (end-to-end runs of up to a minute or two, interpret-mode kernels) run first, so
  # that no long test starts near the end while the other xdist worker has nothing left; the sort is
  # stable, so file order (and fixture sharing) holds within each group, and every worker collects
  # the same order.
  items.sort(key=lambda item: "slow" not in item.keywords)
  if (why := libtpu_missing()):
    for item in items:
      if "tpu_aot" in item.keywords:
        item.add_marker(pytest.mark.skip(reason=f"marker `tpu_aot`: {why}"))
  if jax.default_backend() == "cpu" and jax.device_count() < 8:
    few = pytest.mark.skip(reason=f"marker `multi_device`: needs 8 CPU devices, this run has "
                                  f"{jax.device_count()} ($LINEAX_LM_TEST_CPU_DEVICES)")
    for item in items:
      if "multi_device" in item.keywords:
        item.add_marker(few)
  if jax.default_backend() in ("gpu", "cuda"):
    return
  skip = pytest.mark.skip(reason="needs a GPU (marker `gpu`): run on the GPU host")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_checkpoint():
  """The shipped SmolLM2-135M teacher (lineax_lm.distill.checkpoints.load_teacher), read once per
  test process: parsing its GGUF (49k tokenizer entries) and dequantising takes seconds."""
  from lineax_lm.distill import checkpoints
  return checkpoints.load_teacher(checkpoints.smollm2_gguf_path())


def pytest_sessionfinish(session):
  if _OWNS_CACHE:
    shutil.rmtree(_CACHE, ignore_errors=True)
