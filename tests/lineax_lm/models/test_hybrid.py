"""HybridLM: packed == unpacked, an all-attention model is a Llama, generation."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lineax_lm.models import compile as compile_lib
from lineax_lm.models.hybrid import HybridLM, init_params, make_packing, segment_ids_from_cu_seqlens
from tests.lineax_lm.tiny import tiny_config, tokens


@pytest.mark.parametrize("mixer", ["gated_deltanet", "mlstm"])
def test_rescaled_residual_init(mixer):
  """residual_init="rescale": only the projections into the residual stream (every mixer's output
  projection, mLSTM's proj_down among them, and the MLPs' down_proj) start smaller, by sqrt(2L)."""
  layers = 8
  cfg = tiny_config(mixer, num_layers=layers, attn_ratio="3:1", init_std=0.02)
  stds = {}
  for init in ("normal", "rescale"):
    params = nnx.to_pure_dict(init_params(cfg.replace(residual_init=init), 0))
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    stds[init] = {jax.tree_util.keystr(k): float(np.std(v)) for k, v in flat if v.ndim == 2}
  outputs = [k for k in stds["normal"] if any(n in k for n in ("'o_proj'", "'proj_down'", "'down_proj'"))]
  assert len(outputs) == 2 * layers
  for k, normal in stds["normal"].items():
    if normal == 0:  # zero-initialised (mLSTM's gates)
      continue
    ratio = stds["rescale"][k] / normal
    expected = 1 / np.sqrt(2 * layers) if k in outputs else 1.0
    assert abs(ratio - expected) < 0.15 * expected, (k, ratio)
  with pytest.raises(ValueError, match="residual_init"):
    cfg.replace(residual_init="zero")


def test_make_packing():
  seg = jnp.asarray([[3, 3, 5, 5, 5], [1, 1, 1, 1, 2]])
  packing, positions, overflow = make_packing(seg, max_segments=4)
  np.testing.assert_array_equal(packing.cu_seqlens, [[0, 2, 5], [0, 4, 5]])  # per row
  np.testing.assert_array_equal(positions, [[0, 1, 0, 1, 2], [0, 1, 2, 3, 0]])
  assert not bool(overflow)
  traced = jax.jit(lambda s: make_packing(s, 3))(seg)
  np.testing.assert_array_equal(traced[0].cu_seqlens, [[0, 2, 5, 5], [0, 4, 5, 5]])  # 3 + 1 a row
  assert bool(jax.jit(lambda s: make_packing(s, 1)[2])(seg))  # 2 sequences in a row > 1
  np.testing.assert_array_equal(segment_ids_from_cu_seqlens([0, 2, 5, 6], 6), [[0, 0, 1, 1, 1, 2]])


@pytest.mark.parametrize("mixer", ["gated_deltanet"] + [pytest.param(m, marks=pytest.mark.slow)
                                                     for m in ("rwkv6", "retention", "hgrn")])
def test_packed_equals_unpacked(mixer):
  """Two rows of two sequences each: packed logits == each sequence run alone (jit, static bound).
  gated_deltanet runs as a 3:1 hybrid (attention masks); rwkv6 has token shifts (in RWKV-6 blocks,
  the channel mixing's too), retention RoPE, hgrn the elementwise op."""
  kw = {"gated_deltanet": dict(num_layers=4, attn_ratio="3:1"), "rwkv6": dict(block="rwkv6")}
  kw = kw.get(mixer, {})
  model = HybridLM(tiny_config(mixer, **kw), nnx.Rngs(0))
  x = jnp.asarray(tokens((2, 24), seed=3))
  seg = jnp.asarray([[0] * 9 + [1] * 15, [4] * 15 + [2] * 9])
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, x, seg):
    m = nnx.merge(graphdef, state)
    short, long = jnp.stack([x[0, :9], x[1, 15:]]), jnp.stack([x[0, 9:], x[1, :15]])
    return m(x, segment_ids=seg), m(short), m(long)

  packed, short, long = run(state, x, seg)
  np.testing.assert_allclose(np.asarray(packed[0, :9]), np.asarray(short[0]), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(packed[1, 15:]), np.asarray(short[1]), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(packed[0, 9:]), np.asarray(long[0]), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(np.asarray(packed[1, :15]), np.asarray(long[1]), atol=2e-4, rtol=1e-4)


def test_too_many_segments_under_jit_gives_nan():
  model = HybridLM(tiny_config("gated_deltanet", num_layers=1, max_segments=1), nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  seg = jnp.asarray([[0] * 5 + [1] * 5])
  run = jax.jit(lambda s, x, seg: nnx.merge(graphdef, s)(x, segment_ids=seg))
  out = run(state, jnp.asarray(tokens((1, 10))), seg)
  assert np.all(np.isnan(out))


def llama_reference(model, x):
  """A Llama forward written from the HF layout (embed -> [RMSNorm, attention, RMSNorm, SwiGLU] ->
  RMSNorm -> tied head), reading the weights by their Llama names."""
  from tests.lineax_lm.layers.test_layers import llama_attention_reference
  cfg = model.config
  p = lambda v: np.asarray(v[...], np.float64)
  rms = lambda h, w: h / np.sqrt(np.mean(h * h, -1, keepdims=True) + cfg.norm_eps) * w
  silu = lambda t: t / (1 + np.exp(-t))
  h = p(model.embed.embedding)[np.asarray(x)]
  for blk in model.blocks:
    a, m = blk.mixer, blk.mlp
    u = rms(h, p(blk.attn_norm.weight))
    h = h + llama_attention_reference(u, p(a.q_proj.kernel), p(a.k_proj.kernel), p(a.v_proj.kernel),
                                      p(a.o_proj.kernel), cfg.heads, cfg.kv_heads, cfg.rope_theta)
    u = rms(h, p(blk.mlp_norm.weight))
    h = h + (silu(u @ p(m.gate_proj.kernel)) * (u @ p(m.up_proj.kernel))) @ p(m.down_proj.kernel)
  return rms(h, p(model.norm.weight)) @ p(model.embed.embedding).T


def test_all_attention_model_is_a_llama():
  cfg = tiny_config("transformer", tie_embeddings=True, rope_theta=100000.0, norm_eps=1e-5)
  model = HybridLM(cfg, nnx.Rngs(0))
  x = tokens((2, 12))
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(x))), llama_reference(model, x), atol=1e-4,
                             rtol=1e-4)
  names = {".".join(map(str, k)) for k, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  assert names == {"embed.embedding", "norm.weight"} | {
      f"blocks.{i}.{n}" for i in range(2) for n in (
          "attn_norm.weight", "mixer.q_proj.kernel", "mixer.k_proj.kernel", "mixer.v_proj.kernel",
          "mixer.o_proj.kernel", "mlp_norm.weight", "mlp.gate_proj.kernel", "mlp.up_proj.kernel",
          "mlp.down_proj.kernel")}


def test_remat_gives_the_same_gradients():
  x = jnp.asarray(tokens((2, 8)))
  grads = []
  for remat in ("none", "full"):
    model = HybridLM(tiny_config("transformer", num_layers=1, remat=remat), nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(x) ** 2)
    grads.append(jax.jit(jax.grad(loss))(state))
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_keep_states_reaches_every_layers_ops(monkeypatch, scan):
  """ModelConfig.keep_states: each layer's shared call is traced again with its ops' states kept
  (the flag is part of that call's cache key, which a context read at trace time is not), in the
  per-layer loop and in the scan, in training only; on the xla backend it changes nothing."""
  entered = []
  real = compile_lib.states_kept

  @contextlib.contextmanager
  def recording(keep=True):
    if keep:
      entered.append(True)
    with real(keep):
      yield

  monkeypatch.setattr(compile_lib, "states_kept", recording)
  jax.clear_caches()  # a trace an earlier test left would be reused without entering `recording`
  x = jnp.asarray(tokens((2, 8)))
  outs = []
  # under remat the backward recomputes each layer's forward: its states are kept whatever the flag
  for keep, remat in ((False, "none"), (True, "none"), (False, "full")):
    entered.clear()
    model = HybridLM(tiny_config(num_layers=2, scan_layers=scan, keep_states=keep, remat=remat),
                     nnx.Rngs(0))
    outs.append(model(x))
    assert bool(entered) == (keep or remat != "none")
    entered.clear()
    model.generate(np.asarray(tokens((1, 4))), max_new_tokens=2)  # prefill and decode: no backward
    assert not entered
  for out in outs[1:]:
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(out))


@pytest.mark.gpu
def test_keep_states_gives_the_same_gradients_with_the_gpu_kernels():
  x = jnp.asarray(tokens((2, 256)))
  grads = []
  for keep, remat in ((False, "none"), (True, "none"), (False, "full")):  # full: states kept
    model = HybridLM(tiny_config(num_layers=2, backend="gpu", keep_states=keep, remat=remat),
                     nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(x) ** 2)
    grads.append(jax.jit(jax.grad(loss))(state))
  # One program run twice on an H100 differs by 8e-8 of the largest gradient (the GEMMs' split
  # reductions are not deterministic); kept states and remat stay within that order (8e-8, 1.3e-7).
  for other in grads[1:]:
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(other)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                 atol=1e-6 * np.abs(np.asarray(a)).max())


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["gated_deltanet", "hgrn2"])
def test_scanned_layers_equal_the_unrolled_loop(mixer):
  """The training forward scans over repeats of the layer pattern (here a linear and an attention
  block at 1:1; HGRN-2's per-layer lower bounds ride along the scan): same loss and parameter
  gradients as the per-layer loop, and the same parameter tree. float32: at this size bf16
  rounding alone moves the gradients by ~20% (either way)."""
  x = jnp.asarray(tokens((2, 8)))
  outs, grads = [], []
  for scan in (False, True):
    model = HybridLM(tiny_config(mixer, num_layers=4, attn_ratio="1:1", scan_layers=scan), nnx.Rngs(0))
    assert (model._scan_period() is not None) == scan
    graphdef, state = nnx.split(model)
    loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(x) ** 2)
    value, grad = jax.jit(jax.value_and_grad(loss))(state)
    outs.append(value)
    grads.append(grad)
  assert jax.tree.structure(grads[0]) == jax.tree.structure(grads[1])
  np.testing.assert_allclose(float(outs[0]), float(outs[1]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-4 * np.abs(a).max())


def _constraints(jaxpr) -> list:
  """The sharding_constraint equations of a jaxpr and every jaxpr nested in it, in order."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "sharding_constraint":
      found.append(eqn)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found += _constraints(inner)
  return found


@pytest.mark.multi_device
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_residual_stream_keeps_the_batch_layout_under_fsdp(scan):
  """Under a training mesh the embeddings and every block's output are constrained to the batch's
  layout (rows over data and fsdp): left to sharding propagation, an unscanned FSDP step followed
  the parameters' layout into the activations and kept them all (lineax_lm.sharding.constrain_rows);
  without a mesh nothing is constrained."""
  from jax.sharding import Mesh
  from lineax_lm import sharding
  layers = 4
  model = HybridLM(tiny_config("hgrn", num_layers=layers, scan_layers=scan), nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  x = jnp.asarray(tokens((4, 8)))
  hidden = lambda s: nnx.merge(graphdef, s).hidden(x)[0]
  assert not _constraints(jax.make_jaxpr(hidden)(state).jaxpr)
  mesh = Mesh(np.array(jax.devices()[:2]).reshape(1, 2, 1, 1), sharding.MESH_AXES,
              axis_types=(jax.sharding.AxisType.Auto,) * len(sharding.MESH_AXES))
  with jax.set_mesh(mesh):
    found = _constraints(jax.make_jaxpr(hidden)(state).jaxpr)
  # the embeddings, then each block (a scan's body is traced once: one block of the pattern)
  assert len(found) == (2 if scan else 1 + layers)
  for eqn in found:
    assert tuple(eqn.params["sharding"].spec)[:2] in ((("fsdp",), None), ("fsdp", None))


def test_every_param_has_logical_axes():
  model = HybridLM(tiny_config("hgrn", num_layers=4, attn_ratio="3:1"), nnx.Rngs(0))
  for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = v.get_metadata().get("out_sharding")
    assert axes is not None and len(axes) == v[...].ndim, path


def test_generate_greedy_matches_argmax_and_stops_at_eos():
  model = HybridLM(tiny_config("gated_deltanet", attn_ratio="1:1"), nnx.Rngs(0))  # GDN + attention
  prompt = jnp.asarray(tokens((2, 5), seed=1))
  out = model.generate(prompt, 6, temperature=0)
  assert out.shape == (2, 11)
  np.testing.assert_array_equal(np.asarray(out[:, :5]), np.asarray(prompt))
  # greedy: every new token is the argmax of the full forward over the tokens before it
  want = jnp.argmax(jax.jit(model.__call__)(out[:, :-1])[:, 4:], -1)
  np.testing.assert_array_equal(np.asarray(out[:, 5:]), np.asarray(want))
  # top_k = 1 sampling (with a top_p filter too) is greedy; after eos a row repeats eos
  eos = int(out[0, 7])
  got = np.asarray(model.generate(prompt, 6, temperature=0.7, top_k=1, top_p=0.9, rng=jax.random.key(3),
                                  eos_id=eos))
  want = np.asarray(out).copy()
  for row in want:
    hits = np.flatnonzero(row[5:] == eos)
    if hits.size:
      row[5 + hits[0]:] = eos
  np.testing.assert_array_equal(got, want)
  assert np.all(got[0, 7:] == eos)
  with pytest.raises(ValueError, match="rng"):
    model.generate(prompt, 2, temperature=1.0)
  with pytest.raises(ValueError, match="top_p"):
    model.generate(prompt, 2, temperature=1.0, top_p=0.0, rng=jax.random.key(0))


def test_under_remat_a_step_forms_each_layers_states_twice():
  """Under remat the backward recomputes each layer's forward, which keeps the states the backward
  would otherwise form again (ModelConfig.keep_states): a training step then forms each layer's
  states twice (its forward and the recomputed one), as without remat, not three times. Counted in
  the step lowered for CUDA (pallas_kernels.gpu_aot: no GPU needed)."""
  from pallas_kernels import gpu_aot
  x = jnp.asarray(tokens((2, 128)))

  def state_passes(**kw):
    model = HybridLM(tiny_config(num_layers=1, backend="gpu", **kw), nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    loss = lambda s: jnp.sum(nnx.merge(graphdef, s)(x) ** 2)  # noqa: E731
    kernels = gpu_aot.triton_kernels(jax.value_and_grad(loss), state)
    return sum(k.name == "_state_kernel" for k in kernels)

  assert state_passes(remat="full") == state_passes() == 2


def test_under_remat_kept_states_cost_no_memory_between_forward_and_backward(monkeypatch, capsys):
  """What the forward saves for the backward (jax.ad_checkpoint.print_saved_residuals): under
  remat the same with the states kept (as a model under remat always keeps them) as with them
  formed again (`states_kept` made a no-op); without remat the kept states are saved too."""
  from jax.ad_checkpoint import print_saved_residuals
  x = jnp.asarray(tokens((2, 128)))
  real = compile_lib.states_kept

  def saved(keep=True, **kw):
    monkeypatch.setattr(compile_lib, "states_kept",
                        real if keep else lambda _=True: real(False))
    jax.clear_caches()  # the layers' shared calls were traced with the other `states_kept`
    model = HybridLM(tiny_config(num_layers=2, backend="gpu", **kw), nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    print_saved_residuals(lambda s: jnp.sum(nnx.merge(graphdef, s)(x) ** 2), state)
    return capsys.readouterr().out.splitlines()

  assert saved(remat="full") == saved(keep=False, remat="full")
  assert len(saved(keep_states=True)) > len(saved(keep=False, keep_states=True))
