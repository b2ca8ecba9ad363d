"""The front door every op shares: the top-level exports, the support table and the README's copy
of it, and the initial state that backends receive."""
import importlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels
from pallas_kernels.common import api, dispatch

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_every_public_op_is_exported_at_the_top():
  for family in dispatch.FAMILIES:
    for kind in dispatch.KINDS:
      name = f"{kind}_{family}"
      assert getattr(pallas_kernels, name) is getattr(__import__(f"pallas_kernels.{family}",
                                                                 fromlist=[name]), name)
      assert name in pallas_kernels.__all__


def test_support_table_covers_every_family_and_reference_defines_every_op():
  table = dispatch.support_table()
  assert {f for f, _, _ in table} == set(dispatch.FAMILIES)
  assert all(table[f, "chunk", "xla"] for f in dispatch.FAMILIES)
  for f in dispatch.FAMILIES:
    for kind in dispatch.KINDS:
      assert dispatch.resolve(f, kind, "reference") is not None


def test_readme_table_is_the_support_table():
  """Regenerate with: python -c "from pallas_kernels.common import dispatch;
  print(dispatch.support_markdown())" and paste it under the README's comment line."""
  assert dispatch.support_markdown() in README.read_text()


@pytest.mark.parametrize("family", dispatch.FAMILIES)
def test_backends_receive_a_concrete_float32_initial_state(family, monkeypatch):
  """api.run hands the backend float32 zeros of the family's state layout when the caller gives
  none, so no backend handles `initial_state=None` itself."""
  seen = {}

  def fake_backend(*args, initial_state, cu_seqlens, **options):
    seen.update(state=initial_state, options=options)
    return args[0], initial_state

  monkeypatch.setattr(dispatch, "resolve", lambda *a, **k: fake_backend)
  op = getattr(pallas_kernels, f"chunk_{family}")
  B, T, H, K, V = 2, 8, 3, 4, 5
  x = lambda *s: jnp.asarray(np.random.default_rng(0).standard_normal(s), jnp.float32)
  gate = lambda *s: -jnp.abs(x(*s))
  args = {"hgrn": (x(B, T, 6), gate(B, T, 6)),
          "mlstm": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), x(B, T, H), x(B, T, H)),
          "simple_gla": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gate(B, T, H)),
          "gla": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gate(B, T, H, K)),
          "rwkv6": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gate(B, T, H, K), x(H, K)),
          "delta_rule": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), x(B, T, H)),
          "gated_delta_rule": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gate(B, T, H), x(B, T, H)),
          "kda": (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gate(B, T, H, K), x(B, T, H))
          }.get(family, (x(B, T, H, K), x(B, T, H, K), x(B, T, H, V)))
  op(*args, **({"normalize": False} if family == "linear_attn" else {}))  # one backend call
  expected = {"hgrn": [(B, 6)], "mlstm": [(B, H, K, V), (B, H, K), (B, H)]}.get(family, [(B, H, K, V)])
  leaves = seen["state"] if isinstance(seen["state"], tuple) else (seen["state"],)
  assert [s.shape for s in leaves] == expected
  assert all(s.dtype == jnp.float32 and not jnp.any(s) for s in leaves)
  if family != "hgrn":
    assert seen["options"]["scale"] == K ** -0.5


def test_state_errors_name_the_argument():
  d = api.Dims(B=2, T=4, H=3, K=4, V=5, N=2)
  mlstm = api.State(("[N, H, K, V]", "[N, H, K]", "[N, H]"), names=("C", "n", "m"))
  with pytest.raises(ValueError, match=r"`initial_state` must be the tuple \(C \[N, H, K, V\]"):
    api.concrete_state(jnp.zeros((2, 3, 4, 5)), mlstm, d)
  with pytest.raises(ValueError, match="`initial_state n` must have shape"):
    api.concrete_state((jnp.zeros((2, 3, 4, 5)), jnp.zeros((2, 3, 5)), jnp.zeros((2, 3))), mlstm, d)
  with pytest.raises(ValueError, match="`initial_state` must have shape"):
    api.concrete_state(jnp.zeros((1, 3, 4, 5)), api.MATRIX, d)
  with pytest.raises(ValueError, match="`initial_state` must be a floating-point array; got dtype "
                                       "complex64"):
    api.concrete_state(jnp.zeros((2, 3, 4, 5), jnp.complex64), api.MATRIX, d)


def _qkv(K=4):
  x = lambda *s: jnp.asarray(np.random.default_rng(0).standard_normal(s), jnp.float32)
  return x(1, 8, 2, K), x(1, 8, 2, K), x(1, 8, 2, 4)


@pytest.mark.parametrize("scale,message", [
    (float("nan"), "`scale` must be finite; got nan"), (float("inf"), "`scale` must be finite; got inf"),
    (jnp.float32(jnp.inf), "`scale` must be finite; got inf"),
    ("0.5", r"`scale` must be a real number \(the query scale; None: K \*\* -0.5\); got str '0.5'"),
    (True, "`scale` must be a real number"),
])
def test_scale_must_be_a_finite_real_number(scale, message):
  with pytest.raises(ValueError, match=message):
    pallas_kernels.chunk_linear_attn(*_qkv(), scale=scale, backend="xla")


def test_head_dims_of_zero_are_refused():
  with pytest.raises(ValueError, match=r"`q`, `k` and `v` must have head dims K, V >= 1; got K = 0"):
    pallas_kernels.chunk_linear_attn(*_qkv(K=0), backend="xla")


@pytest.mark.parametrize("family", dispatch.FAMILIES)
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_auto_takes_the_platform_kernel_wherever_the_table_says_there_is_one(family, platform,
                                                                            monkeypatch):
  """What `backend="auto"` resolves to on a GPU or TPU host, without one: the family's Pallas module
  when support_table() lists it and the module is not opt-in (`AUTO = False`), else the xla path."""
  monkeypatch.setattr(dispatch, "platform", lambda: platform)
  for kind in dispatch.KINDS:
    fn = dispatch.resolve(family, kind)
    listed = dispatch.support_table()[family, kind, platform]
    expected = platform if listed and dispatch.auto_selects(family, platform) else "xla"
    module = importlib.import_module(f"pallas_kernels.{family}.{expected}")
    assert getattr(fn, "func", fn) is getattr(module, f"{kind}_{family}")


def test_traced_gates_are_clamped_with_their_gradient_passed_through():
  """Under jit a positive log decay is clamped to 0; the clamp's gradient is 1 everywhere, so the
  backward keeps no mask of the gates (the gates of valid inputs, <= 0, are not changed)."""
  from pallas_kernels.common import checks
  g = jnp.array([-2.0, 0.0, 3.0])
  clamp = jax.jit(lambda g: checks.log_decay("g", g))
  np.testing.assert_array_equal(clamp(g), [-2.0, 0.0, 0.0])
  np.testing.assert_array_equal(jax.grad(lambda g: jnp.sum(clamp(g) * jnp.arange(3.0)))(g), [0, 1, 2])
