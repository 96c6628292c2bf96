"""Every random draw made for an example depends only on (seed, step, its index), not on its row
in a batch or micro-batch nor on the number of hosts: augmentations in the input pipeline,
dropout and attention dropout in the ViT, the masked-patch-prediction corruption.

The whole training run on several topologies is tests/test_topology_invariance.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import input_pipeline, models
from vit_jax.configs import pretrain
from vit_jax.models import mpp, ops

B = 8


@pytest.fixture(scope="module")
def dataset():
  config = pretrain.get_config("dataset=fashion_mnist,runlocal").dataset
  config.pp_train = "decode|inception_crop|flip_lr|value_range(-1, 1)"
  return config


def _global_batches(dataset, hosts, steps, state=None):
  """The first `steps` global batches read by `hosts` simulated hosts (host h's rows are the
  h-th block), and the hosts' states after them."""
  iterators = [
    input_pipeline.make_train_iterator(
      dataset, global_batch_size=B, seed=3, process_index=h, process_count=hosts, state=state
    )
    for h in range(hosts)
  ]
  try:
    batches = [
      {k: np.concatenate([b[k] for b in parts]) for k in ("image", "label")}
      for parts in ([next(it) for it in iterators] for _ in range(steps))
    ]
    return batches, [it.get_state() for it in iterators]
  finally:
    for it in iterators:
      it.close()


def test_augmented_examples_follow_the_stream_position_on_any_number_of_hosts(dataset):
  """Row r of global batch b is the same augmented example (inception crop and flip included)
  on one host and on two, and a stream read by two hosts resumes on one where it stopped."""
  one, _ = _global_batches(dataset, 1, 4)
  two, states = _global_batches(dataset, 2, 2)
  for a, b in zip(one[:2], two, strict=True):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(one[0]["image"], one[1]["image"])
  resumed, _ = _global_batches(dataset, 1, 2, state=states[0])
  for a, b in zip(one[2:], resumed, strict=True):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def _dropout_model():
  return models.get_model("testing", 10, dropout_rate=0.3, attention_dropout_rate=0.3)


def test_dropout_masks_follow_the_example_not_its_row():
  """The same example with the same id and key gets the same dropout (MLP, residual and
  attention dropout) whether it sits in row 0 or row 7 of a batch, or alone in a micro-batch."""
  model = _dropout_model()
  images = jax.random.uniform(jax.random.PRNGKey(0), (B, 16, 16, 3), minval=-1, maxval=1)
  params = model.init(jax.random.PRNGKey(1), images[:1], train=False)["params"]
  key = jax.random.PRNGKey(2)

  @jax.jit
  def logits(x, ids):  # the representation: the zero-initialised head would hide everything
    _, out = model.apply({"params": params}, x, train=True, example_ids=ids, rngs={"dropout": key})
    return out["pre_logits"]

  ids = jnp.arange(B) + 100
  out = logits(images, ids)
  order = jnp.roll(jnp.arange(B), 1)  # example 7 moves to row 0, example 0 to row 1, ...
  np.testing.assert_allclose(logits(images[order], ids[order]), out[order], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logits(images[7:], ids[7:]), out[7:], rtol=1e-5, atol=1e-6)
  # Dropout is on: another id is another mask.
  assert not np.allclose(logits(images[7:], ids[:1]), out[7:], atol=1e-4)


@pytest.mark.parametrize(
  "shape,n,key",
  [
    ((6, 5, 7), 6, jax.random.PRNGKey(3)),  # [batch, tokens, width]: one row per example
    ((4 * 9, 16), 4, jax.random.PRNGKey(4)),  # an MLP's flattened tokens: 9 rows per example
    ((3 * 2, 3, 5), 3, jax.random.key(5)),  # a typed key, 2 rows of [3, 5] per example
  ],
)
def test_dropout_mask_is_bernoulli_under_the_examples_key(shape, n, key):
  """ops.dropout's mask for example i is, bit for bit, jax.random.bernoulli(fold_in(key, id_i),
  1 - rate) over the example's own shape (drawn here through a vmap over examples, as before
  the mask was computed in x's shape), and its kept elements are scaled by 1 / (1 - rate)."""
  rate = 0.3
  ids = jnp.array([7, 1, 100_003, 2, 5, 9][:n])
  x = jax.random.uniform(jax.random.PRNGKey(0), shape, minval=0.5, maxval=1.5)
  out = jax.jit(ops.dropout, static_argnums=1)(x, rate, key, ids)
  per_example = (n, shape[0] // n, *shape[1:])
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, ids)
  expected = jax.vmap(lambda k: jax.random.bernoulli(k, 1 - rate, per_example[1:]))(keys)
  np.testing.assert_array_equal(out != 0, expected.reshape(shape))
  np.testing.assert_array_equal(out[out != 0], (x / (1 - rate))[out != 0])
  assert 0.6 < float(expected.mean()) < 0.8


def test_mpp_corruption_follows_the_example_not_its_row():
  x = jax.random.normal(jax.random.PRNGKey(0), (B, 16, 4))
  mask_embedding = jnp.zeros([4])
  key = jax.random.PRNGKey(3)
  ids = jnp.arange(B) * 3
  out, kind = mpp.corrupt(key, x, mask_embedding, example_ids=ids)
  order = jnp.roll(jnp.arange(B), 1)
  out_p, kind_p = mpp.corrupt(key, x[order], mask_embedding, example_ids=ids[order])
  np.testing.assert_array_equal(kind_p, kind[order])
  np.testing.assert_array_equal(out_p, out[order])
  assert len({tuple(np.asarray(k)) for k in kind}) == B  # every image its own corruption
