"""Every family against its own float64 numpy recurrence, forward and every gradient, with a
non-default `scale`: through the public op (backend "xla" and "reference": a front door that mixes
up its arguments fails both) and through the backend modules' functions called directly (a backend
that drops the caller's scale fails here even if a front door hid it).

The recurrences below are written from each family's definition (README / reference docstrings),
sharing no code with the package. Gradients are checked as directional derivatives: for each input
(and the initial state) a few random directions, central finite differences of the float64 loss
sum(o * do) + sum(S * dS) against the float32 gradient's projection. Shapes are tiny but cross a
chunk boundary (T = 70, chunk 64), with H = 2 heads of distinct gates.
"""
import dataclasses
import importlib

import jax
import numpy as np
import pytest

from tests.pallas_kernels import cases, harness
from tests.pallas_kernels.harness import OpCase

B, T, H, K, V = 1, 70, 2, 8, 6
SCALE = 0.37      # not K ** -0.5 = 0.354
DIRECTIONS = 3
EPS = 1e-6        # finite-difference step (float64)
FWD_TOL = 2e-6    # float32 paths against float64: measured ~2e-8 to 5e-7
GRAD_TOL = 2e-5   # directional derivatives: measured ~5e-8 to 4e-6


# --- float64 recurrences, one per family ---------------------------------------------------------

def additive64(q, k, v, g, h0, scale, u=None):
  """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T; o_t = S_t^T (scale q_t), or with the RWKV-6 bonus
  u: o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale q_t). g broadcasts to [B, T, H, K]."""
  g = np.broadcast_to(g, q.shape)
  S, outs = h0, []
  for t in range(q.shape[1]):
    kv = k[:, t, :, :, None] * v[:, t, :, None, :]
    S_next = np.exp(g[:, t])[..., None] * S + kv
    read = S_next if u is None else S + u[..., None] * kv
    outs.append(np.einsum("bhkv,bhk->bhv", read, scale * q[:, t]))
    S = S_next
  return np.stack(outs, 1), S


def delta64(q, k, v, g, beta, h0, scale):
  """S_t = diag(exp(g_t)) S_{t-1}; S_t += k_t (beta_t (v_t - S_t^T k_t))^T; o_t = S_t^T (scale q_t)."""
  g = np.broadcast_to(g, q.shape)
  S, outs = h0, []
  for t in range(q.shape[1]):
    S = np.exp(g[:, t])[..., None] * S
    u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t]))
    S = S + k[:, t, :, :, None] * u[..., None, :]
    outs.append(np.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
  return np.stack(outs, 1), S


def hgrn64(x, g, h0):
  h, outs = h0, []
  for t in range(x.shape[1]):
    h = np.exp(g[:, t]) * h + x[:, t]
    outs.append(h)
  return np.stack(outs, 1), h


def mlstm64(q, k, v, i, f, state, scale, eps=1e-6):
  """mlstm_kernels' stabilized recurrent step (xLSTM), in float64."""
  C, n, m = state
  logf, outs = -np.logaddexp(0.0, -f), []
  for t in range(q.shape[1]):
    m_new = np.maximum(logf[:, t] + m, i[:, t])
    fa, ia = np.exp(logf[:, t] + m - m_new), np.exp(i[:, t] - m_new)
    C = fa[..., None, None] * C + ia[..., None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
    n = fa[..., None] * n + ia[..., None] * k[:, t]
    qs = scale * q[:, t]
    den = np.maximum(np.abs(np.sum(n * qs, -1)), np.exp(-m_new)) + eps
    outs.append(np.einsum("bhkv,bhk->bhv", C, qs) / den[..., None])
    m = m_new
  return np.stack(outs, 1), (C, n, m)


def normalized64(q, k, v, h0, scale):
  """Linear attention with fla's normalizer from h0 = (S_0, z_0 [B, 1, H, K]):
  o_t / (scale q_t . z_t + 1e-10), z_t = z_0 + sum_{s <= t} k_s; the state is (S, z_T)."""
  S0, z0 = h0
  o, S = additive64(q, k, v, 0.0, S0, scale)
  z = z0 + np.cumsum(k, axis=1)
  den = np.sum(scale * q * z, -1, keepdims=True) + 1e-10
  return o / den, (S, z[:, -1:])


def retention_g64(H):
  return np.log(1.0 - 2.0 ** (-5.0 - np.arange(H)))[None, None, :, None]


@dataclasses.dataclass(frozen=True)
class Family:
  case: OpCase
  module: str           # pallas_kernels.<module>: its xla.py and reference.py are called directly
  op: str               # the backend function's name, e.g. "chunk_gla"
  truth: object         # (inputs as float64 numpy, h0, scale) -> (o, S)
  direct: bool = True   # False where the front door does part of the op (normalize)


FAMILIES = [
    Family(cases.GLA, "gla", "chunk_gla",
           lambda x, h0, s: additive64(x["q"], x["k"], x["v"], x["g"], h0, s)),
    Family(cases.SIMPLE_GLA, "simple_gla", "chunk_simple_gla",
           lambda x, h0, s: additive64(x["q"], x["k"], x["v"],
                                       (x["g"] + x["g_gamma"])[..., None], h0, s)),
    Family(cases.RETENTION, "retention", "chunk_retention",
           lambda x, h0, s: additive64(x["q"], x["k"], x["v"], retention_g64(H), h0, s)),
    Family(cases.LINEAR_ATTN, "linear_attn", "chunk_linear_attn",
           lambda x, h0, s: additive64(x["q"], x["k"], x["v"], 0.0, h0, s)),
    Family(cases.LINEAR_ATTN_NORMALIZED, "linear_attn", "chunk_linear_attn",
           lambda x, h0, s: normalized64(x["q"], x["k"], x["v"], h0, s), direct=False),
    Family(cases.RWKV6, "rwkv6", "chunk_rwkv6",
           lambda x, h0, s: additive64(x["r"], x["k"], x["v"], x["w"], h0, s, u=x["u"])),
    Family(cases.GDN, "gated_delta_rule", "chunk_gated_delta_rule",
           lambda x, h0, s: delta64(x["q"], x["k"], x["v"], x["g"][..., None], x["beta"], h0, s)),
    Family(cases.DELTA_RULE, "delta_rule", "chunk_delta_rule",
           lambda x, h0, s: delta64(x["q"], x["k"], x["v"], 0.0, x["beta"], h0, s)),
    Family(cases.KDA, "kda", "chunk_kda",
           lambda x, h0, s: delta64(x["q"], x["k"], x["v"], x["g"], x["beta"], h0, s)),
    Family(cases.HGRN, "hgrn", "chunk_hgrn", lambda x, h0, s: hgrn64(x["x"], x["g"], h0)),
    Family(cases.MLSTM, "mlstm", "chunk_mlstm",
           lambda x, h0, s: mlstm64(x["q"], x["k"], x["v"], x["i"], x["f"], h0, s)),
]


def op_under_test(family: Family, path: str):
  """The op as harness.run_op calls it: fn(*inputs, initial_state=, output_final_state=,
  cu_seqlens=, **scale) -> (o, S)."""
  if path.startswith("public-"):
    return lambda *a, **kw: family.case.chunk(*a, backend=path.removeprefix("public-"), **kw)
  module = importlib.import_module(f"pallas_kernels.{family.module}.{path.removeprefix('direct-')}")
  fn = getattr(module, family.op)
  return lambda *a, output_final_state, **kw: fn(*a, **kw)


def float64_loss(family, x64, h0, do, dS, scale):
  o, S = family.truth(x64, h0, scale)
  leaves = S if isinstance(S, tuple) else (S,)
  return np.sum(o * do) + sum(np.sum(s * c) for s, c in zip(leaves, dS))


def directional_errors(loss64, x64, h64, grads, rng):
  """Every gradient (of each input of x64 and of the initial state h64) as directional derivatives
  against central differences of the float64 loss64(x, h): {"d<name>": relative error} over
  DIRECTIONS random directions each."""
  errors = {}
  for name in list(x64) + ["initial_state"]:
    got, want = [], []
    for _ in range(DIRECTIONS):
      base = h64 if name == "initial_state" else x64[name]
      d = jax.tree_util.tree_map(lambda a: rng.standard_normal(a.shape), base)
      moved = lambda sign: jax.tree_util.tree_map(lambda a, b: a + sign * EPS * b, base, d)
      at = lambda sign: (loss64(x64, moved(sign)) if name == "initial_state"
                         else loss64(dict(x64, **{name: moved(sign)}), h64))
      want.append((at(1) - at(-1)) / (2 * EPS))
      got.append(sum(np.sum(np.asarray(a, np.float64) * b) for a, b in
                     harness.paired_leaves(grads[name], d, f"d{name}")))
    errors[f"d{name}"] = harness.rel_rms(got, want)
  return errors


PATHS = ["public-xla", "public-reference", "direct-xla", "direct-reference"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.case.name)
def test_matches_float64_recurrence(family, path):
  if path.startswith("direct-") and not family.direct:
    pytest.skip("the front door does part of this op")
  case = family.case
  rng = np.random.default_rng(harness.seed_of("float64", case.name))
  inputs = case.make_inputs(rng, B, T, H, K, V)
  h0 = case.make_state(rng, B, H, K, V)
  out_shape = case.out_shape(B, T, H, K, V) if case.out_shape else (B, T, H, V)
  do = harness.normal(rng, *out_shape)
  dS = jax.tree_util.tree_map(lambda s: harness.normal(rng, *s.shape), h0)
  scale = dict(scale=SCALE) if case.scaled else {}
  fn = op_under_test(family, path)
  o, S, (g_in, g_h0) = harness.run_op(case, fn, inputs, h0, (do, dS), None, **scale)

  f64 = lambda tree: jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)
  x64, h64, do64 = f64(dict(inputs)), f64(h0), f64(do)
  dS64 = tuple(jax.tree_util.tree_leaves(f64(dS)))
  o64, S64 = family.truth(x64, h64, SCALE)
  errors = {"o": harness.rel_rms(o, o64)}
  for i, (s, r) in enumerate(harness.paired_leaves(S, f64(S64), "final_state")):
    errors[f"final_state[{i}]"] = harness.rel_rms(s, r)
  bad = {n: e for n, e in errors.items() if not e < FWD_TOL}
  assert not bad, f"{case.name} via {path}: forward errors against float64 {bad}"

  loss = lambda x, h: float64_loss(family, x, h, do64, dS64, SCALE)
  errors = directional_errors(loss, x64, h64, dict(g_in, initial_state=g_h0), rng)
  bad = {n: e for n, e in errors.items() if not e < GRAD_TOL}
  assert not bad, f"{case.name} via {path}: gradient errors against float64 {bad}"
