"""From a source's raw record to the example a batch holds, one class per task.

The pipeline (pipeline.py) turns each raw record into one example with `record_fn`; `position`
is the record's place in the run's stream (training) or in its split (evaluation), and all of the
record's randomness is a function of (seed, position). A task's examples (`for_source`) give:
  * `process(raw, position)`: the example (`image`, `label`, `mask`, `status`, `pixels`, and the
    fields its `check` reads); it may fail on bad data;
  * `fallback(status)`: the example standing for a record that failed (a zero image, mask 0);
  * `check(batch)`: on a batch of examples (with `where`), ends the run in one line on a data
    error that is no skipped example (a label outside the classes, a mask of another size than
    its image), naming the batch's first such record, and keeps the fields the iterators take:
    image, label, mask and the host fields (`HOST_FIELDS`); once per batch, the message built
    only when a record fails;
  * `pad()`: an evaluation's padding (mask 0, status PAD), an unchecked example like the others.

  classification  `pp_train` / `pp_eval` (preprocess.py, TensorFlow ops; stateless seed
                  [seed·1,000,003 + 1,000, position], [0, position] in evaluation); label int32
                  [], or float32 multi-hot [K] with `multi_label`;
  segmentation    decoding, checks and augmentation in numpy and PIL (segmentation.py, run with
                  tf.numpy_function; numpy's `default_rng([seed, 1, position])`, seed 0 in
                  evaluation); label int32 [S, S], IGNORE_LABEL where a pixel does not count.

An encoded image (and a segmentation mask) declaring more than `max_image_pixels` pixels
(image_header) is not decoded: a zero image with mask 0 and status TOO_LARGE.
"""

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from vit_jax.input_pipeline import bad_data, image_header, preprocess, segmentation, source

# Per-example fields of the pipeline's batches that stay on the host (bad_data.SkipCounter).
HOST_FIELDS = ("status", "where", "pixels")

# Every function traced by tf.data here is plain graph code: AutoGraph conversion (which re-parses
# the Python source with `ast`) buys nothing and is a hazard on CPython 3.11.7, whose `ast.parse`
# can fail with "AST constructor recursion depth mismatch" while other threads parse too.
graph_fn = tf.autograph.experimental.do_not_convert


def record_fn(examples, src: source.Source):
  """fn(raw, position) → the example, with `where`.

  For a source whose records may fail to parse or decode the fn returns a one-element dataset
  (for `interleave`) holding the example, or `examples.fallback` if it failed (a damaged file's
  placeholder: LOST, else UNDECODABLE); for in-memory arrays (`src.may_fail` False) it returns
  the example itself, for a plain `map`.
  """
  if not src.may_fail:
    # Nothing to catch: a plain map, without a nested dataset per record.
    @graph_fn
    def direct(raw, position):
      return {**examples.process(raw, position), "where": src.where(raw)}

    return direct

  @graph_fn
  def sandboxed(raw, position):
    where = src.where(raw)
    fallback = examples.fallback(tf.where(src.lost(raw), bad_data.LOST, bad_data.UNDECODABLE))
    good = tf.data.Dataset.from_tensors((raw, position)).map(graph_fn(examples.process))
    out = good.ignore_errors().concatenate(tf.data.Dataset.from_tensors(fallback)).take(1)
    return out.map(graph_fn(lambda ex: {**ex, "where": where}))

  return sandboxed


def _declared_pixels(max_pixels: int, *encoded: tf.Tensor) -> tf.Tensor | None:
  """The most pixels one of `encoded` declares (int64 scalar), read without decoding them; None
  when there is no bound or nothing encoded."""
  if max_pixels <= 0 or any(e.dtype != tf.string for e in encoded):
    return None
  return tf.reduce_max(tf.stack([image_header.declared_pixels(e) for e in encoded]))


class _Task:
  """What both kinds of example share: the checked batch's fields, and padding."""

  def fallback(self, status) -> dict:
    raise NotImplementedError

  def _passed(self, batch: dict, ok, message: Callable[[tf.Tensor], tf.Tensor]) -> dict:
    """The fields the iterators take from `batch`, once every row's `ok` holds (else the run
    stops with `message(row)` of the first row that fails, which bad_data reads back). Checked
    once per batch, the message built only on a failure: per record, its string ops were a
    good part of the input pipeline's CPU time (docs/benchmarks.md, "Around the step")."""
    passed = tf.reduce_all(ok)
    text = tf.cond(
      passed, lambda: tf.constant(""), lambda: message(tf.argmin(tf.cast(ok, tf.int32)))
    )
    assertion = tf.debugging.Assert(passed, [text], summarize=1)
    with tf.control_dependencies([assertion]):
      return {
        "image": tf.identity(batch["image"]),
        "label": batch["label"],
        "mask": batch["mask"],
        **{k: batch[k] for k in HOST_FIELDS},
      }

  def pad(self) -> dict:
    return {**self.fallback(tf.constant(bad_data.PAD)), "where": tf.constant("")}


class Classification(_Task):
  """Images with an int64 label (or several: multi_label), preprocessed by a pp spec."""

  def __init__(self, config, src: source.Source, num_classes: int, pp_spec: str, seed):
    self.source, self.num_classes = src, num_classes
    self.size = int(config.image_size)
    self.pp_fn = preprocess.get_preprocess_fn(pp_spec, self.size)
    self.multi = bool(config.multi_label)
    self.max_pixels = int(config.max_image_pixels or 0)
    self.rng_base = 0 if seed is None else int(seed) * 1_000_003 + 1_000

  def _label_blank(self):
    return tf.zeros([self.num_classes], tf.float32) if self.multi else tf.zeros([], tf.int32)

  def process(self, raw, position):
    rng = tf.stack([tf.constant(self.rng_base, tf.int64), tf.cast(position, tf.int64)])
    image, labels = self.source.parse(raw)
    pixels = _declared_pixels(self.max_pixels, image)
    if pixels is None:
      image, status, pixels = (
        self.pp_fn(image, rng),
        tf.constant(bad_data.OK),
        tf.constant(0, tf.int64),
      )
    else:
      too_large = pixels > self.max_pixels
      blank = tf.zeros([self.size, self.size, 3], tf.float32)
      image = tf.cond(too_large, lambda: blank, lambda: self.pp_fn(image, rng))
      status = tf.where(too_large, bad_data.TOO_LARGE, bad_data.OK)
    labels = tf.reshape(labels, [-1])
    num_classes = self.num_classes
    in_range = (labels >= 0) & (labels < num_classes)
    bad_label = tf.pad(tf.boolean_mask(labels, ~in_range), [[0, 1]], constant_values=-1)[0]
    if self.multi:
      label = tf.minimum(tf.reduce_sum(tf.one_hot(labels, num_classes), axis=0), 1.0)
      count_ok = tf.constant(True)
    else:
      label = tf.cast(tf.pad(labels, [[0, 1]])[0], tf.int32)
      count_ok = tf.equal(tf.size(labels), 1)
    error = tf.where(tf.reduce_all(in_range), tf.where(count_ok, 0, 2), 1)
    return {
      "image": image,
      "label": label,
      "mask": tf.where(status == bad_data.OK, 1.0, 0.0),
      "error": error,
      "bad_label": bad_label,
      "num_labels": tf.size(labels),
      "status": status,
      "pixels": pixels,
    }

  def fallback(self, status):
    return {
      "image": tf.zeros([self.size, self.size, 3], tf.float32),
      "label": self._label_blank(),
      "mask": tf.constant(0.0),
      "error": tf.constant(0),
      "bad_label": tf.constant(-1, tf.int64),
      "num_labels": tf.constant(0),
      "status": status,
      "pixels": tf.constant(0, tf.int64),
    }

  def check(self, batch):
    def message(row):
      problem = tf.cond(
        batch["error"][row] == 1,
        lambda: tf.strings.join(
          [
            "label ",
            tf.strings.as_string(batch["bad_label"][row]),
            f" outside [0, {self.num_classes}) in ",
          ]
        ),
        lambda: tf.strings.join(
          [
            tf.strings.as_string(batch["num_labels"][row]),
            " labels (single-label data needs exactly one; set dataset.multi_label=True for "
            "lists of labels) in ",
          ]
        ),
      )
      return tf.strings.join([bad_data.ERROR_MARK, problem, batch["where"][row]])

    return self._passed(batch, tf.equal(batch["error"], 0), message)


class Segmentation(_Task):
  """Images with a label per pixel: decoded, checked and augmented in numpy (segmentation.py)."""

  def __init__(self, config, src: source.Source, num_classes: int, pp_spec: str, seed):
    self.source, self.num_classes = src, num_classes
    self.size = int(config.image_size)
    self.ops = segmentation.parse_ops(pp_spec)
    self.max_pixels = int(config.max_image_pixels or 0)
    self.seed = 0 if seed is None else int(seed)

  def _example(self, image, mask, where, position):
    rng = np.random.default_rng([self.seed, 1, int(position)])
    image, label, problem = segmentation.example(
      image,
      mask,
      where.decode(errors="replace"),
      num_classes=self.num_classes,
      channels=self.source.channels,
      ops=self.ops,
      size=self.size,
      rng=rng,
    )
    return image, label, problem.encode()

  def _blank(self):
    return (
      tf.zeros([self.size, self.size, 3], tf.float32),
      tf.fill([self.size, self.size], tf.constant(segmentation.IGNORE_LABEL, tf.int32)),
    )

  def process(self, raw, position):
    image, mask, where = self.source.parse(raw)
    pixels = _declared_pixels(self.max_pixels, image, mask)

    def decoded():
      out = tf.numpy_function(
        self._example,
        [image, mask, where, tf.cast(position, tf.int64)],
        [tf.float32, tf.int32, tf.string],
        stateful=False,
      )
      size = self.size
      return (
        tf.ensure_shape(out[0], [size, size, 3]),
        tf.ensure_shape(out[1], [size, size]),
        tf.ensure_shape(out[2], []),
      )

    if pixels is None:
      (image, label, problem), status = decoded(), tf.constant(bad_data.OK)
      pixels = tf.constant(0, tf.int64)
    else:
      too_large = pixels > self.max_pixels
      image, label, problem = tf.cond(too_large, lambda: (*self._blank(), tf.constant("")), decoded)
      status = tf.where(too_large, bad_data.TOO_LARGE, bad_data.OK)
    return {
      "image": image,
      "label": label,
      "mask": tf.where(status == bad_data.OK, 1.0, 0.0),
      "problem": problem,
      "status": status,
      "pixels": pixels,
    }

  def fallback(self, status):
    image, label = self._blank()
    return {
      "image": image,
      "label": label,
      "mask": tf.constant(0.0),
      "problem": tf.constant(""),
      "status": status,
      "pixels": tf.constant(0, tf.int64),
    }

  def check(self, batch):
    def message(row):
      return tf.strings.join([bad_data.ERROR_MARK, batch["problem"][row]])

    return self._passed(batch, tf.equal(batch["problem"], ""), message)


TASKS = {source.CLASSIFICATION: Classification, source.SEGMENTATION: Segmentation}


def for_source(config, src: source.Source, num_classes: int, pp_spec: str, seed: int | None):
  """The examples of `src`'s task; `seed` None for an evaluation."""
  return TASKS[src.task](config, src, num_classes, pp_spec, seed)
