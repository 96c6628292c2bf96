"""ImageNet ReaL top-1: hand-made batches with known answers, and tfds imagenet2012_real (mock)."""

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

# Imported at collection, while the process has one thread (see tests/test_input_sources.py).
from tensorflow_datasets.testing import mocking as tfds_mocking

from vit_jax import evaluators
from vit_jax.configs import finetune
from vit_jax.evaluators import real


def _multi_hot(sets, k=5):
  out = np.zeros((len(sets), k), np.float32)
  for i, s in enumerate(sets):
    out[i, list(s)] = 1.0
  return out


def _logits(top1, k=5):
  return np.eye(k, dtype=np.float32)[top1] * 3.0


def test_known_answers():
  # Top-1 classes 0, 1, 2, 3, 4, 0; sets {0, 2}, {2}, {}, {3}, {}, {1} (the last is padding).
  logits = _logits([0, 1, 2, 3, 4, 0])
  labels = _multi_hot([{0, 2}, {2}, set(), {3}, set(), {1}])
  mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
  sums = real.batch_metrics(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask))
  # In the set: images 0 and 3; outside: image 1; empty sets (2, 4) and padding (5) left out.
  assert float(sums["correct"]) == 2.0 and float(sums["count"]) == 3.0


def test_evaluator_over_batches():
  logits = _logits([0, 1, 2, 3, 4, 0, 1])
  labels = _multi_hot([{0, 2}, {2}, set(), {3}, set(), {0, 1}, {4}])

  def data():
    for start in (0, 4):
      n = len(logits[start : start + 4])
      pad = 4 - n
      yield {
        "image": np.pad(logits[start : start + 4], [(0, pad), (0, 0)])[:, None, None, :],
        "label": np.pad(labels[start : start + 4], [(0, pad), (0, 0)], constant_values=1.0),
        "mask": np.array([1.0] * n + [0.0] * pad, np.float32),
      }

  ev = real.RealEvaluator(lambda p, x: jnp.reshape(x, (x.shape[0], -1)), data, name="real")
  # Images with a set: 0 ✓, 1 ✗, 3 ✓, 5 ✓ (top-1 0 in {0, 1}), 6 ✗; padding has a full set.
  assert ev.run({}) == {"real/accuracy": 3 / 5, "real/num_examples": 5.0}
  single = real.RealEvaluator(
    lambda p, x: x[:, 0, 0],
    lambda: [{"image": logits[:, None, None], "label": np.zeros(7), "mask": np.ones(7)}],
  )
  with pytest.raises(ValueError, match="multi-hot ReaL labels"):
    single.run({})


def test_imagenet_preset_has_real_beside_val():
  config = finetune.get_config("dataset=imagenet2012,holdout=false")
  assert config.evals.val.split == "" and config.evals.real.type == "real"
  assert config.evals.real.dataset.name == "imagenet2012_real"
  assert config.evals.real.dataset.label_key == "real_label"
  assert "real" not in finetune.get_config("dataset=cifar10").evals


def _real_records(self, split, decoders=None, read_config=None, **kwargs):
  """Four imagenet2012_real records: ReaL sets {7}, {}, {1, 7}, {3}."""
  del self, split, decoders, read_config, kwargs
  png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8))
  sets = [[7], [], [1, 7], [3]]
  return tf.data.Dataset.from_generator(
    lambda: ({"image": png.numpy(), "label": 0, "real_label": s} for s in sets),
    output_signature={
      "image": tf.TensorSpec([], tf.string),
      "label": tf.TensorSpec([], tf.int64),
      "real_label": tf.TensorSpec([None], tf.int64),
    },
  )


def test_through_tfds_and_the_preset():
  config = finetune.get_config("dataset=imagenet2012,holdout=false,runlocal")
  entry = config.evals.real.to_dict()
  entry.pop("max_examples")

  def predict(params, images):  # top-1 class 7 for every image
    return jnp.zeros((images.shape[0], 1000)).at[:, 7].set(1.0)

  with tfds_mocking.mock_data(policy=tfds_mocking.MockPolicy.USE_CODE, as_dataset_fn=_real_records):
    (ev,) = evaluators.build({"real": entry}, model=None, dataset=config.dataset, batch_size=4)
    ev_predict = real.RealEvaluator(predict, ev.data, name="real")
    # {7} ✓, {} left out, {1, 7} ✓, {3} ✗.
    assert ev_predict.run({}) == {"real/accuracy": 2 / 3, "real/num_examples": 3.0}
