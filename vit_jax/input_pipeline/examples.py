"""From a source's raw record to the example a batch holds, one class per task.

The pipeline (pipeline.py) turns each raw record into one example with `record_fn`; `position`
is the record's place in the run's stream (training) or in its split (evaluation), and all of the
record's randomness is a function of (seed, position). A task's examples (`for_source`) give:
  * `process(raw, position)`: the example (`image`, `label`, `mask`, `status`, `pixels`, and the
    fields its `check` reads); it may fail on bad data;
  * `fallback(status)`: the example standing for a record that failed (a zero image, mask 0);
  * `check(batch)`: ends the run in one line on a data error that is no skipped example (a label
    outside the classes, a bad mask), and keeps the fields the iterators take (`_Task._kept`);
  * `pad()`: an evaluation's padding (mask 0, status PAD), an unchecked example like the others.

Their randomness: a stateless seed [seed·1,000,003 + 1,000, position] for classification's pp
ops ([0, position] in evaluation), `default_rng([seed, 1, position])` for segmentation's and
detection's (seed 0 in evaluation). An image (or mask) declaring more than `max_image_pixels` pixels is not decoded
(status TOO_LARGE).
"""

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from vit_jax.input_pipeline import bad_data
from vit_jax.input_pipeline.ops import detection as detection_ops
from vit_jax.input_pipeline.ops import image_header, preprocess
from vit_jax.input_pipeline.ops import segmentation as segmentation_ops
from vit_jax.input_pipeline.sources import base, detection, segmentation

# Per-example fields of the pipeline's batches that stay on the host (bad_data.SkipCounter);
# `why` (a bad annotation's problem) only in detection's.
HOST_FIELDS = ("status", "where", "pixels", "why")

# Every function traced by tf.data here is plain graph code: AutoGraph conversion (which re-parses
# the Python source with `ast`) buys nothing and is a hazard on CPython 3.11.7, whose `ast.parse`
# can fail with "AST constructor recursion depth mismatch" while other threads parse too.
graph_fn = tf.autograph.experimental.do_not_convert


def record_fn(examples, src: base.Source):
  """fn(raw, position) → the example, with `where`: for a source whose records may fail, a
  one-element dataset (for `interleave`) holding the example, or `examples.fallback` if it failed
  (LOST for a damaged file's placeholder, else UNDECODABLE); else the example, for a plain `map`."""
  if not src.may_fail:  # nothing to catch: no nested dataset per record
    return graph_fn(lambda raw, pos: {**examples.process(raw, pos), "where": src.where(raw)})

  @graph_fn
  def sandboxed(raw, position):
    where = src.where(raw)
    fallback = examples.fallback(tf.where(src.lost(raw), bad_data.LOST, bad_data.UNDECODABLE))
    good = tf.data.Dataset.from_tensors((raw, position)).map(graph_fn(examples.process))
    out = good.ignore_errors().concatenate(tf.data.Dataset.from_tensors(fallback)).take(1)
    return out.map(graph_fn(lambda ex: {**ex, "where": where}))

  return sandboxed


def _fields(image, label, status, pixels, **task_fields) -> dict:
  """An example: mask 1 where the status is OK, else 0 (the fallbacks, padding, too large)."""
  mask = tf.where(status == bad_data.OK, 1.0, 0.0)
  return dict(image=image, label=label, mask=mask, status=status, pixels=pixels, **task_fields)


class _Task:
  """What every kind of example shares: the bound on pixels, the checked batch's fields, and
  padding."""

  # The fields of a batch beside `image` that reach the iterators' consumers.
  fields = ("label", "mask")

  def __init__(self, config, src: base.Source, num_classes: int):
    self.source, self.num_classes = src, num_classes
    self.size = int(config.image_size)
    self.max_pixels = int(config.max_image_pixels or 0)

  def _unless_too_large(self, decode: Callable, blank: Callable, *encoded: tf.Tensor):
    """(decode(), status OK, pixels 0), or where one of `encoded` declares more pixels than
    max_image_pixels (read without decoding it), (blank(), status TOO_LARGE, those pixels)."""
    if self.max_pixels <= 0 or any(e.dtype != tf.string for e in encoded):
      return decode(), tf.constant(bad_data.OK), tf.constant(0, tf.int64)
    pixels = tf.reduce_max(tf.stack([image_header.declared_pixels(e) for e in encoded]))
    too_large = pixels > self.max_pixels
    status = tf.where(too_large, bad_data.TOO_LARGE, bad_data.OK)
    return tf.cond(too_large, blank, decode), status, pixels

  def fallback(self, status) -> dict:
    raise NotImplementedError

  def _zeros(self):
    return tf.zeros([self.size, self.size, 3], tf.float32)

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
      return self._kept(batch)

  def _kept(self, batch: dict) -> dict:
    kept = {k: batch[k] for k in (*self.fields, *HOST_FIELDS) if k in batch}
    return {"image": tf.identity(batch["image"]), **kept}

  def pad(self) -> dict:
    return {**self.fallback(tf.constant(bad_data.PAD)), "where": tf.constant("")}


class Classification(_Task):
  """Images with an int64 label (or several: multi_label), preprocessed by a pp spec."""

  def __init__(self, config, src: base.Source, num_classes: int, pp_spec: str, seed):
    super().__init__(config, src, num_classes)
    self.pp_fn = preprocess.get_preprocess_fn(pp_spec, self.size)
    self.multi = bool(config.multi_label)
    self.rng_base = 0 if seed is None else int(seed) * 1_000_003 + 1_000

  def process(self, raw, position):
    rng = tf.stack([tf.constant(self.rng_base, tf.int64), tf.cast(position, tf.int64)])
    encoded, labels = self.source.parse(raw)
    image, status, pixels = self._unless_too_large(
      lambda: self.pp_fn(encoded, rng), self._zeros, encoded
    )
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
    return _fields(
      image, label, status, pixels, error=error, bad_label=bad_label, num_labels=tf.size(labels)
    )

  def fallback(self, status):
    label = tf.zeros([self.num_classes], tf.float32) if self.multi else tf.zeros([], tf.int32)
    no_label = {"error": tf.constant(0), "bad_label": tf.constant(-1, tf.int64)}
    pixels, num_labels = tf.constant(0, tf.int64), tf.constant(0)
    return _fields(self._zeros(), label, status, pixels, **no_label, num_labels=num_labels)

  def check(self, batch):
    def message(row):
      outside = f" outside [0, {self.num_classes}) in "
      label = tf.strings.join(["label ", tf.strings.as_string(batch["bad_label"][row]), outside])
      hint = "single-label data needs exactly one; set dataset.multi_label=True for lists of labels"
      num = tf.strings.as_string(batch["num_labels"][row])
      count = tf.strings.join([num, f" labels ({hint}) in "])
      problem = tf.where(batch["error"][row] == 1, label, count)
      return tf.strings.join([bad_data.ERROR_MARK, problem, batch["where"][row]])

    return self._passed(batch, tf.equal(batch["error"], 0), message)


class Segmentation(_Task):
  """Images with a label per pixel: decoded, checked and augmented in numpy."""

  def __init__(self, config, src: base.Source, num_classes: int, pp_spec: str, seed):
    super().__init__(config, src, num_classes)
    self.ops = segmentation_ops.build(pp_spec)
    self.seed = 0 if seed is None else int(seed)

  def _example(self, image, mask, where, position):
    """One record, encoded bytes or uint8 arrays [h, w, c] and [h, w] (bytes that do not decode
    raise) → (image float32 [S, S, 3], labels int32 [S, S], mask_problem's line: b'' for a good
    record, else the arrays are blank)."""
    mode = ""
    if isinstance(image, bytes):
      image = segmentation.decode_image(image, self.source.channels)
    if isinstance(mask, bytes):
      mask, mode = segmentation.decode_mask(mask)
    problem = segmentation.mask_problem(
      mask, mode, image, self.num_classes, where.decode(errors="replace")
    )
    if problem:
      size = (self.size, self.size)
      blank = np.full(size, segmentation.IGNORE_LABEL, np.int32)
      return np.zeros((*size, 3), np.float32), blank, problem.encode()
    rng = np.random.default_rng([self.seed, 1, int(position)])
    return (*segmentation_ops.augment(image, mask, self.ops, self.size, rng), b"")

  def _blank(self):
    ignored = tf.constant(segmentation.IGNORE_LABEL, tf.int32)
    return self._zeros(), tf.fill([self.size, self.size], ignored)

  def process(self, raw, position):
    image, mask, where = self.source.parse(raw)

    def decoded():
      out = tf.numpy_function(
        self._example,
        [image, mask, where, tf.cast(position, tf.int64)],
        [tf.float32, tf.int32, tf.string],
        stateful=False,
      )
      shapes = ([self.size, self.size, 3], [self.size, self.size], [])
      return tuple(tf.ensure_shape(x, shape) for x, shape in zip(out, shapes, strict=True))

    (image, label, problem), status, pixels = self._unless_too_large(
      decoded, lambda: (*self._blank(), tf.constant("")), image, mask
    )
    return _fields(image, label, status, pixels, problem=problem)

  def fallback(self, status):
    return _fields(*self._blank(), status, tf.constant(0, tf.int64), problem=tf.constant(""))

  def check(self, batch):
    def message(row):
      return tf.strings.join([bad_data.ERROR_MARK, batch["problem"][row]])

    return self._passed(batch, tf.equal(batch["problem"], ""), message)


class Detection(_Task):
  """Images with boxes of classes (sources/detection.py): decoded, checked, augmented and the
  boxes padded to dataset.max_boxes rows, in numpy. An example breaking the rules on boxes
  (detection.annotation_problem) is skipped (status BAD_ANNOTATION, its problem in `why`).

  Its fields: `label` float32 [M, 6], rows (ymin, xmin, ymax, xmax, class, crowd) with the
  corners in [0, 1] of the image as fed to the model, unused rows (0, 0, 0, 0, -1, 0); `size`
  int32 [2], the original image's (height, width).
  """

  fields = ("label", "mask", "size")

  def __init__(self, config, src: base.Source, num_classes: int, pp_spec: str, seed):
    super().__init__(config, src, num_classes)
    self.ops = detection_ops.build(pp_spec)
    self.seed = 0 if seed is None else int(seed)
    self.max_boxes = int(config.max_boxes)

  def _blank_label(self) -> np.ndarray:
    label = np.zeros((self.max_boxes, 6), np.float32)
    label[:, 4] = -1
    return label

  def _example(self, image, objects, position):
    """One record, encoded bytes or uint8 [h, w, c], and its objects float64 [n, 8] (bytes that
    do not decode raise) → (image float32 [S, S, 3], label float32 [M, 6], size int32 [2],
    the annotations' problem: b'' for a good record, else image and label are blank)."""
    if isinstance(image, bytes):
      image = segmentation.decode_image(image, self.source.channels)
    height, width = image.shape[:2]
    size = np.array([height, width], np.int32)
    objects, problem = detection.annotation_problem(
      objects, height, width, self.num_classes, self.max_boxes
    )
    if problem:
      blank = np.zeros((self.size, self.size, 3), np.float32)
      return blank, self._blank_label(), size, problem.encode()
    rng = np.random.default_rng([self.seed, 1, int(position)])
    image, objects = detection_ops.augment(image, objects, self.ops, self.size, rng)
    label = self._blank_label()
    label[: len(objects), :4] = objects[:, :4]
    label[: len(objects), 4:6] = objects[:, 4:6]
    return image, label, size, b""

  def process(self, raw, position):
    image, objects, _ = self.source.parse(raw)

    def decoded():
      out = tf.numpy_function(
        self._example,
        [image, objects, tf.cast(position, tf.int64)],
        [tf.float32, tf.float32, tf.int32, tf.string],
        stateful=False,
      )
      shapes = ([self.size, self.size, 3], [self.max_boxes, 6], [2], [])
      return tuple(tf.ensure_shape(x, shape) for x, shape in zip(out, shapes, strict=True))

    (image, label, size, why), status, pixels = self._unless_too_large(
      decoded, lambda: (*self._blank(), tf.constant("")), image
    )
    status = tf.where(tf.equal(why, ""), status, bad_data.BAD_ANNOTATION)
    return _fields(image, label, status, pixels, size=size, why=why)

  def _blank(self):
    return self._zeros(), tf.constant(self._blank_label()), tf.zeros([2], tf.int32)

  def fallback(self, status):
    image, label, size = self._blank()
    return _fields(image, label, status, tf.constant(0, tf.int64), size=size, why=tf.constant(""))

  def check(self, batch):
    return self._kept(batch)  # bad annotations are skipped examples: nothing ends the run


TASKS = {
  base.CLASSIFICATION: Classification,
  base.SEGMENTATION: Segmentation,
  base.DETECTION: Detection,
}


def for_source(config, src: base.Source, num_classes: int, pp_spec: str, seed: int | None):
  """The examples of `src`'s task; `seed` None for an evaluation."""
  return TASKS[src.task](config, src, num_classes, pp_spec, seed)
