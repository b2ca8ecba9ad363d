"""The learning-rate schedule at every boundary step: the warmup's start and end, the cosine decay
reaching min_lr exactly at `train.steps` and staying there, and no warmup when warmup_steps is 0."""
import ml_collections
import numpy as np
import pytest

from lineax_lm.train import optim


def _schedule(warmup, steps=12, lr=1.0, ratio=0.25):
  cfg = ml_collections.ConfigDict(dict(lr=lr, min_lr_ratio=ratio, warmup_steps=warmup, steps=steps))
  return [float(v) for v in np.asarray([optim.learning_rate_schedule(cfg)(i) for i in range(steps + 3)])]


@pytest.mark.parametrize("warmup", [0, 1, 4, 11])
def test_schedule_at_every_boundary_step(warmup):
  steps, lr, min_lr = 12, 1.0, 0.25
  s = _schedule(warmup, steps, lr, min_lr / lr)
  for i in range(warmup):  # linear from 0: count 0 trains at 0 only when there is a warmup
    assert s[i] == pytest.approx(lr * i / warmup, abs=1e-7)
  end = steps
  assert s[warmup] == lr  # the peak, at count 0 without a warmup
  decay = s[warmup:end + 1]
  assert all(a > b for a, b in zip(decay, decay[1:]))  # strictly down to the end
  assert s[end] == min_lr and s[end - 1] > min_lr  # reached exactly at the last step, not before
  assert s[end + 1] == s[end + 2] == min_lr  # and kept
  if (end - warmup) % 2 == 0:
    assert s[warmup + (end - warmup) // 2] == pytest.approx((lr + min_lr) / 2, abs=1e-6)
