"""`lineax_lm.train.flops.jaxpr_flops`: matmuls counted through scans (times their length), remat,
gradients and shard_map (times its devices)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lineax_lm.train.flops import jaxpr_flops

MATMUL = 2 * 4 * 8 * 8  # [4, 8] @ [8, 8]


def layers(x, w):
  def body(c, _):
    return jnp.tanh(c @ w), None
  y, _ = jax.lax.scan(body, x, None, length=3)
  return jax.checkpoint(lambda y: (y @ w).sum())(y)


def test_a_scan_counts_its_body_times_its_length():
  x, w = jnp.ones((4, 8)), jnp.ones((8, 8))
  assert jaxpr_flops(jax.make_jaxpr(layers)(x, w)) == 4 * MATMUL
  # the gradient: each matmul's forward, its dx and its dw (no recomputed forward: the sum's
  # gradient does not read the last product)
  assert jaxpr_flops(jax.make_jaxpr(jax.grad(layers, argnums=1))(x, w)) == (4 * 3) * MATMUL


@pytest.mark.multi_device
def test_shard_map_counts_every_device():
  mesh = jax.make_mesh((4,), ("d",), devices=jax.devices()[:4])
  x, w = jnp.ones((16, 8)), jnp.ones((8, 8))
  f = jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"))
  with jax.set_mesh(mesh):
    jaxpr = jax.make_jaxpr(f)(jax.device_put(x, jax.NamedSharding(mesh, P("d"))), w)
  assert jaxpr_flops(jaxpr) == 2 * 16 * 8 * 8 == 4 * MATMUL
  np.testing.assert_equal(jaxpr_flops(jax.make_jaxpr(lambda x, w: x @ w)(x, w)), 4 * MATMUL)
