r"""Classifies image files with a trained checkpoint and prints the top-5 classes.

  python -m vit_jax.predict --checkpoint=/tmp/vit_ft cat.png dog.jpg
  python -m vit_jax.predict --checkpoint=ViT-B_16_imagenet2012.npz --class_names=names.txt x.jpg

The checkpoint is a workdir (its latest step), a step directory or an `.npz`. A workdir's
`config.json` gives the architecture, dataset, image size and evaluation preprocessing; class
names come from `--class_names` (one name a line), else the dataset, else the class index is
printed. For a bare `.npz` the architecture is read from the parameter shapes and the image size
from the position embeddings (or `--image_size`). Images are preprocessed as in evaluation with
PIL and numpy (vit_jax.inference, the library behind this command); TensorFlow is imported only
to look up a dataset's class names. An unreadable image is skipped with one warning line.

A workdir of the segment stage segments the images instead, writing `<name>_mask.png` (class
indices) and `<name>_overlay.png` to `--masks_dir` (docs/segmentation.md):

  python -m vit_jax.predict --checkpoint=/tmp/seg --masks_dir=/tmp/masks canvas.png

A workdir of the detect stage detects objects: it prints the detections as JSON, in COCO's
results format with each image's file name (`file_name`, `category_id` = class index + 1,
`category`, `bbox` [x, y, width, height] in the image's pixels, `score`; every detection the
model keeps, as the evaluator scores them), and with `--boxes_dir` writes `<name>_boxes.png`,
the image with the boxes scoring at least `--min_score` drawn (docs/detection.md):

  python -m vit_jax.predict --checkpoint=/tmp/det --boxes_dir=/tmp/boxes canvas.png
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import json
import os
from collections.abc import Sequence

import numpy as np
from absl import app

from vit_jax import checkpoint as checkpoint_lib
from vit_jax import inference
from vit_jax.runtime import cli


def format_predictions(path: str, top: list[tuple[int, str, float]]) -> str:
  lines = [path]
  for rank, (index, name, prob) in enumerate(top, 1):
    label = name if name == f"class {index}" else f"{name} ({index})"
    lines.append(f"  {rank}. {100 * prob:6.2f}%  {label}")
  return "\n".join(lines)


define_flags = cli.define_flags(
  checkpoint=cli.CHECKPOINT,
  class_names=cli.CLASS_NAMES,
  image_size=cli.IMAGE_SIZE,
  model=cli.MODEL,
  top_k=cli.Flag(5, "How many classes to print per image."),
  batch_size=cli.BATCH_SIZE,
  masks_dir=cli.Flag(str, "Segmentation checkpoints: where to write the masks (PNG)."),
  boxes_dir=cli.Flag(str, "Detection checkpoints: where to write the images with their boxes."),
  min_score=cli.Flag(0.3, "Detection checkpoints: the lowest score of a drawn box."),
)


def main(argv: Sequence[str], f) -> None:
  paths = list(argv[1:])
  if not paths:
    raise app.UsageError("give one or more image files after the flags")
  missing = [p for p in paths if not os.path.exists(p)]
  if missing:
    raise app.UsageError(f"no such file: {', '.join(missing)}")
  if f.masks_dir.value:
    return segment(paths, f)
  saved = checkpoint_lib.saved_config(f.checkpoint.value)
  if saved is not None and saved.get("stage") == "detect":
    return detect(paths, f)
  if f.boxes_dir.value:
    raise app.UsageError(f"--boxes_dir: {f.checkpoint.value} is no detect stage checkpoint")
  names = inference.read_class_names(f.class_names.value) if f.class_names.value else None
  classifier = inference.Classifier(
    f.checkpoint.value, model=f.model.value, image_size=f.image_size.value, class_names=names
  )
  paths, images = inference.read_images(paths)
  probs = classifier.probabilities(images, f.batch_size.value)
  for path, p in zip(paths, probs, strict=True):
    idx = np.argsort(-p, kind="stable")[: min(f.top_k.value, classifier.num_classes)]
    print(format_predictions(path, [(int(i), classifier.name(int(i)), float(p[i])) for i in idx]))


def segment(paths: list[str], f) -> None:
  """Writes each image's mask and overlay into --masks_dir; prints the classes found."""
  segmenter = inference.Segmenter(f.checkpoint.value)
  paths, images = inference.read_images(paths)
  os.makedirs(f.masks_dir.value, exist_ok=True)
  for path, image, mask in zip(paths, images, segmenter.masks(images), strict=True):
    stem = os.path.join(f.masks_dir.value, os.path.splitext(os.path.basename(path))[0])
    inference.mask_image(mask).save(stem + "_mask.png")
    inference.overlay_image(image, mask).save(stem + "_overlay.png")
    counts = np.bincount(mask.ravel(), minlength=segmenter.num_classes)
    found = [
      f"{segmenter.class_names[i] if segmenter.class_names else i} {counts[i] / mask.size:.1%}"
      for i in np.argsort(-counts, kind="stable")
      if counts[i]
    ]
    print(f"{path} -> {stem}_mask.png: {', '.join(found)}")


def detections_json(detector: inference.Detector, paths, images, found) -> list[dict]:
  """The detections of each image in COCO's results format, with its file name (see the module
  docstring): boxes through the evaluator's own conversion, so its AP is the evaluator's."""
  from vit_jax.evaluators import detection as detection_eval  # noqa: PLC0415

  out = []
  for path, image, d in zip(paths, images, found, strict=True):
    width, height = image.size
    boxes = detection_eval.to_coco_bbox(d["boxes"], height, width)
    for box, score, k in zip(boxes, d["scores"], d["classes"], strict=True):
      out.append(
        dict(
          file_name=path,
          category_id=int(k) + 1,
          category=detector.name(int(k)),
          bbox=[float(v) for v in box],
          score=float(score),
        )
      )
  return out


def detect(paths: list[str], f) -> None:
  """Prints the detections (JSON); with --boxes_dir writes each image with its boxes drawn."""
  detector = inference.Detector(f.checkpoint.value)
  paths, images = inference.read_images(paths)
  found = detector.detect(images, f.batch_size.value)
  results = detections_json(detector, paths, images, found)
  if f.boxes_dir.value:
    os.makedirs(f.boxes_dir.value, exist_ok=True)
    for path, image in zip(paths, images, strict=True):
      shown = [r for r in results if r["file_name"] == path and r["score"] >= f.min_score.value]
      labels = [f"{r['category']} {r['score']:.2f}" for r in shown]
      drawn = inference.draw_boxes(
        image, [r["bbox"] for r in shown], labels, [r["category_id"] - 1 for r in shown]
      )
      stem = os.path.splitext(os.path.basename(path))[0]
      drawn.save(os.path.join(f.boxes_dir.value, f"{stem}_boxes.png"))
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  cli.run(main, "predict", define_flags, errors=(ValueError, FileNotFoundError, KeyError))
