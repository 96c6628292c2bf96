r"""Object detection from ViT patch tokens, the paper's other open question (§5), in miniature.

  python -m experiments.detection            # about half an hour on 2 quiet cores
  python -m experiments.detection --quick    # a minute or two: the same stages, tiny budgets (CI)

The task is `fashion_mnist_det` (vit_jax/input_pipeline/sources/detection_synthetic.py): 64x64
canvases holding 1 to 4 Fashion-MNIST items of 12 to 36 pixels over a noisy background, each
boxed and labelled with its class (10 classes). The experiment:

  1. pretrains the demo ViT on Fashion-MNIST classification, the demo's pretraining recipe
     (`configs/pretrain.py:dataset=fashion_mnist`) at experiments/segmentation.py's shorter
     budget (the same flags);
  2. trains `configs/detect.py` (ViTDet's simple pyramid and an FCOS head) with
       - the ViT initialised from that pretraining (position embeddings resized 8x8 → 16x16),
       - the same ViT from scratch,
       - a BiT ResNet (R26x1, the baseline family of the paper) from scratch, with the same
         pyramid and head; its last map has stride 32 (2x2 at 64px), so its pyramid's scales
         are configs/detect.py's 4, 2, 1 for a BiT (strides 8, 16, 32, the finest the
         pyramid's x4 reaches) where the ViT's are 1, 1/2, 1/4 of its stride-4 map (strides 4,
         8, 16), and the same ViT from scratch at BiT's budget beside it,
     with Adam and a cosine schedule (configs/detect.py), the ViTs `steps`, BiT `bit_steps`;
  3. scores everything on the test split (1,000 canvases) with the COCO protocol (AP, AP50,
     AP75, AP small/medium/large; vit_jax/evaluators/detection.py), beside a non-learned
     baseline on exactly those canvases: the connected components of the canvas thresholded at
     a grey level (fitted on training canvases), each component's box a detection, classified
     by a raw-pixel 5-nearest-neighbour vote among the training canvases' ground-truth objects
     (crops resized to 28x28), scored by its share of the vote;
  4. prints the table, writes table.md, detection.png (AP and AP50 per encoder),
     examples.png (test canvases with the best ViT's detections beside their ground truth) and
     results.json.

FULL budget (`FULL`): pretraining 300 steps of 128 at 32px, then 1,000 steps of 32 canvases
(32,000, 8 epochs of the 4,000) for the ViTs and 400 (12,800) for BiT and the ViT beside it.
On 2 quiet cores at 64px and batch 32 the demo ViT's detector trains at about 100 canvases/s
and BiT-R26x1's at about 16 (XLA:CPU's convolutions; with one unit per block, 18: no cheaper
to speak of, so the full R26x1 is kept): BiT's 400 steps take as long as 2,500 of the ViT's.

Stages run as their printed `python -m vit_jax.main` commands would (experiments/common.py:
run_stage, in this process). Workdirs under `--workdir` (default /tmp/vit_detection: pretrain/,
then <encoder>/) are removed first. Outputs go to `--out` (default
experiments/results/detection/; with --quick, <workdir>/results/).
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

import dataclasses
import os
import time
import types

import numpy as np
from absl import flags

from experiments import common, fingerprint, segmentation
from vit_jax.runtime import cli

WORKDIR = "/tmp/vit_detection"
DATASET = "fashion_mnist_det"
# name → (title, model family, initialised from the pretraining, its budget: the Profile's
# `steps` or `bit_steps`)
ENCODERS = {
  "vit_pretrained": ("ViT (demo), pretrained on Fashion-MNIST", "vit", True, "steps"),
  "vit_scratch": ("ViT (demo), from scratch", "vit", False, "steps"),
  "vit_scratch_short": ("ViT (demo), from scratch, BiT's budget", "vit", False, "bit_steps"),
  "bit_scratch": ("BiT-R26x1, from scratch", "bit", False, "bit_steps"),
}
MIN_SCORE = 0.3  # the detections drawn in examples.png
KNN = 5  # neighbours of the baseline's classifier
CROP = 28  # side of the baseline's crops, the objects' own resolution
FIT_CANVASES = 300  # training canvases the baseline's threshold is fitted on


@dataclasses.dataclass(frozen=True)
class Profile:
  vit: str  # model preset of the ViT (the pretraining's)
  bit: str
  bit_flags: tuple[str, ...]  # beside the BiT preset (quick: one unit per block)
  image_size: int
  steps: int  # the ViT runs'
  bit_steps: int  # BiT's, and a ViT from scratch beside it at the same budget
  batch_size: int
  eval_batch_size: int
  train_split: str
  val_split: str
  test_split: str


FULL = Profile(
  vit="demo",
  bit="R26x1",
  bit_flags=(),
  image_size=64,
  steps=1000,
  bit_steps=400,
  batch_size=32,
  eval_batch_size=100,
  train_split="train",
  val_split="val",
  test_split="test",
)
QUICK = Profile(
  vit="testing",
  bit="R26x1",
  # R26x1's strides and widths with one bottleneck unit per block instead of two: the same code
  # path, its step compiled in about half the time.
  bit_flags=("--config.model.block_units=(1,1,1,1)",),
  image_size=32,
  steps=4,
  bit_steps=3,
  batch_size=8,
  eval_batch_size=16,
  train_split="train[:64]",
  val_split="val[:16]",
  test_split="test[:32]",
)


def pretrain_flags(quick: bool) -> list[str]:
  """The pretraining of experiments/segmentation.py (the demo's recipe at a shorter budget)."""
  return segmentation.pretrain_flags(segmentation.QUICK if quick else segmentation.FULL, quick)


def detect_flags(profile: Profile, encoder: str, pretrained: str) -> list[str]:
  """`configs/detect.py` for one encoder, at the profile's budget."""
  _, family, from_pretraining, budget = ENCODERS[encoder]
  model = profile.vit if family == "vit" else profile.bit
  steps = getattr(profile, budget)
  flags = [f"--config=configs/detect.py:dataset={DATASET},model={model}"]
  flags.append(
    f"--config.model_init={pretrained}" if from_pretraining else "--config.init_from_scratch=true"
  )
  if family == "bit":
    flags += profile.bit_flags
  return flags + [
    f"--config.dataset.image_size={profile.image_size}",
    f"--config.dataset.train_split={profile.train_split}",
    f"--config.dataset.eval_split={profile.val_split}",
    f"--config.evals.test.split={profile.test_split}",
    f"--config.total_steps={steps}",
    f"--config.batch_size={profile.batch_size}",
    f"--config.eval_batch_size={profile.eval_batch_size}",
    f"--config.schedule.warmup_steps={max(steps // 10, 1)}",
    f"--config.checkpoint.every_steps={steps}",
    f"--config.log_every_steps={max(steps // 8, 1)}",
    "--config.evals.val.every_steps=-1",  # the test split is what is reported
  ]


# ---------------------------------------------------------------------------------------------
# The non-learned baseline, on the canvases the models are scored on.


def canvases(stage: list[str], split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Grey levels [N, S, S] in [-1, 1], label rows [N, M, 6] and original sizes [N, 2] of a split
  as the detection stage of flags `stage` evaluates it (its input pipeline's eval batches, the
  rows that count)."""
  from vit_jax import input_pipeline
  from vit_jax.runtime import config_files

  config = config_files.from_flags(stage)
  batches = input_pipeline.make_eval_iterator(
    config.dataset, split, global_batch_size=config.eval_batch_size
  )
  grey, labels, sizes = [], [], []
  for batch in batches:
    mask = np.asarray(batch["mask"]).astype(bool)
    grey.append(np.asarray(batch["image"])[mask, ..., 0])
    labels.append(np.asarray(batch["label"])[mask])
    sizes.append(np.asarray(batch["size"])[mask])
  return np.concatenate(grey), np.concatenate(labels), np.concatenate(sizes)


def components(grey: np.ndarray, threshold: float) -> list[np.ndarray]:
  """Per canvas of grey [N, S, S]: the boxes [n, 4] (ymin, xmin, ymax, xmax normalised to [0, 1])
  of the connected components (4-connected) of its pixels >= `threshold`."""
  from scipy import ndimage

  size = np.array(grey.shape[1:3] * 2, np.float64)
  out = []
  for image in grey:
    found = ndimage.find_objects(ndimage.label(image >= threshold)[0])
    corners = [(s[0].start, s[1].start, s[0].stop, s[1].stop) for s in found if s is not None]
    out.append(np.asarray(corners, np.float64).reshape(-1, 4) / size)
  return out


def crops(grey: np.ndarray, boxes: list[np.ndarray]) -> np.ndarray:
  """float32 [sum n, CROP*CROP]: the pixels of each canvas of grey [N, S, S] inside each of its
  `boxes` [n, 4] (normalised), resized bilinearly to CROP x CROP and flattened."""
  from PIL import Image

  size = np.array(grey.shape[1:3] * 2, np.float64)
  out = []
  for image, rows in zip(grey, boxes, strict=True):
    for ymin, xmin, ymax, xmax in rows * size:
      y0, x0 = int(np.floor(ymin)), int(np.floor(xmin))
      y1, x1 = max(int(np.ceil(ymax)), y0 + 1), max(int(np.ceil(xmax)), x0 + 1)
      patch = Image.fromarray(np.ascontiguousarray(image[y0:y1, x0:x1], np.float32), mode="F")
      out.append(np.asarray(patch.resize((CROP, CROP), Image.BILINEAR)).ravel())
  return np.asarray(out, np.float32).reshape(-1, CROP * CROP)


def knn(reference: np.ndarray, classes: np.ndarray, queries: np.ndarray, num_classes: int):
  """(class int [q], score [q]) of queries [q, d]: the class most of their KNN nearest (L2)
  `reference` rows [r, d] of `classes` [r] vote for, and the fraction of the KNN that do."""
  if not len(queries):
    return np.zeros(0, np.int64), np.zeros(0)
  distances = (
    np.square(queries).sum(1)[:, None]
    - 2 * queries @ reference.T
    + np.square(reference).sum(1)[None, :]
  )
  nearest = np.argpartition(distances, KNN - 1, axis=1)[:, :KNN]
  votes = np.stack([np.bincount(c, minlength=num_classes) for c in classes[nearest]])
  best = np.argmax(votes, axis=1)
  return best, votes[np.arange(len(best)), best] / KNN


def gt_boxes(labels: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
  """(boxes [n, 4] per canvas, their classes [sum n]) of label rows [N, M, 6] (unused rows out)."""
  rows = [r[r[:, 4] >= 0] for r in labels]
  return [r[:, :4] for r in rows], np.concatenate([r[:, 4] for r in rows]).astype(np.int64)


def detect_components(
  grey: np.ndarray,
  threshold: float,
  reference: tuple[np.ndarray, np.ndarray],
  num_classes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The baseline's detections of grey [N, S, S] in the model's format: boxes [N, D, 4], scores
  [N, D] (0: none) and classes [N, D]; `reference`: the kNN's (crops, classes)."""
  boxes = components(grey, threshold)
  classes, scores = knn(*reference, crops(grey, boxes), num_classes)
  most = max(1, max(len(b) for b in boxes))
  out = (np.zeros((len(grey), most, 4)), np.zeros((len(grey), most)), np.zeros((len(grey), most)))
  start = 0
  for i, b in enumerate(boxes):
    out[0][i, : len(b)] = b
    out[1][i, : len(b)] = scores[start : start + len(b)]
    out[2][i, : len(b)] = classes[start : start + len(b)]
    start += len(b)
  return out


def component_baseline(profile: Profile, stage: list[str], class_names: list[str]) -> dict:
  """COCO metrics on the test split of the connected components' boxes classified by kNN (the
  module docstring). The threshold is the grid value of best AP50 on the first FIT_CANVASES
  training canvases (at most half the training split), their objects classified by the kNN of
  the other training canvases' ground-truth crops; the test's kNN holds every training crop."""
  from vit_jax.evaluators import detection as det_eval

  num_classes = len(class_names)

  def score(grey, labels, sizes, threshold, reference):
    found = detect_components(grey, threshold, reference, num_classes)
    gt = det_eval.ground_truth_dict(labels, sizes, class_names)
    ids = np.arange(len(grey))
    results = det_eval.coco_results(ids, found, sizes, range(1, num_classes + 1))
    metrics = det_eval.coco_metrics(gt, results)
    return dict(metrics, num_images=len(gt["images"]), num_boxes=len(gt["annotations"]))

  grey, labels, sizes = canvases(stage, profile.train_split)
  boxes, classes = gt_boxes(labels)
  every = crops(grey, boxes)
  fit = min(FIT_CANVASES, len(grey) // 2)
  held_out = sum(len(b) for b in boxes[:fit])  # the crops of the fitting canvases come first
  reference = (every[held_out:], classes[held_out:])
  grid = np.round(np.arange(-0.6, 0.61, 0.05), 2)
  ap50 = [score(grey[:fit], labels[:fit], sizes[:fit], t, reference).get("AP50", 0.0) for t in grid]
  threshold = float(grid[int(np.argmax(ap50))])
  test = score(*canvases(stage, profile.test_split), threshold, (every, classes))
  return dict(test, threshold=threshold, fit_canvases=fit, reference_crops=len(every))


# ---------------------------------------------------------------------------------------------
# The run.


def define_flags(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
  """The experiment's flags (vit_jax.runtime.cli)."""
  return types.SimpleNamespace(
    **common.define_stage_flags(values, WORKDIR, "tiny budgets (seconds, for CI)")
  )


def stage_flags(profile: Profile, workdir: str) -> dict[str, list[str]]:
  """Every training stage of `profile` by its workdir's name under `workdir`: its flags."""
  pretrained = os.path.join(workdir, "pretrain")
  stages = {"pretrain": pretrain_flags(profile is QUICK)}
  for encoder in ENCODERS:
    stages[encoder] = detect_flags(profile, encoder, pretrained)
  return stages


def run(profile: Profile, workdir: str, verbose: bool = False) -> dict:
  """Every stage and the baseline of `profile`, in workdirs under `workdir`: the results' dict
  (examples.png's runs are under `workdir` too: `workdir` is kept in `best_vit_workdir`)."""
  from vit_jax.input_pipeline.sources import detection_synthetic

  os.makedirs(workdir, exist_ok=True)
  total_start = time.perf_counter()
  flags = stage_flags(profile, workdir)

  def stage(title, name):
    return common.run_stage(title, flags[name], os.path.join(workdir, name), verbose=verbose)

  # What the training stages read (experiments/fingerprint.py): the pretraining's images, and
  # the canvases every detection run reads.
  inputs = dict(
    pretrain=fingerprint.data(flags["pretrain"]), detect=fingerprint.data(flags["vit_scratch"])
  )
  pretrain, seconds_pretrain = stage("1. pretrain the demo ViT on Fashion-MNIST", "pretrain")
  seconds = dict(pretrain=seconds_pretrain)
  runs = {}
  for encoder, (title, *_) in ENCODERS.items():
    metrics, seconds[encoder] = stage(f"2. detect: {title}", encoder)
    runs[encoder] = {k[len("test/") :]: v for k, v in metrics.items() if k.startswith("test/")}
    runs[encoder].update(loss=metrics.get("loss"), train_accuracy=metrics.get("accuracy"))
  class_names = detection_synthetic.synthetic_class_names(DATASET)
  start = time.perf_counter()
  print("\n== 3. the baseline: connected components, classified by 5-NN on raw pixels", flush=True)
  baseline = component_baseline(profile, flags["vit_scratch"], class_names)
  seconds["baseline"] = time.perf_counter() - start
  seconds["total"] = time.perf_counter() - total_start
  best = max((e for e in ENCODERS if ENCODERS[e][1] == "vit"), key=lambda e: runs[e]["AP"])
  return dict(
    quick=profile is QUICK,
    profile=dataclasses.asdict(profile),
    pretrain={k: v for k, v in pretrain.items() if not k.startswith("fewshot")},
    runs=runs,
    baseline=baseline,
    best_vit=best,
    inputs=inputs,
    seconds=seconds,
  )


def main(argv: list[str], f: types.SimpleNamespace) -> dict:
  from absl import logging

  args = cli.values(f)
  # The baseline's and examples' own reads (input pipeline, checkpoint) log nothing worth showing;
  # the stages log as their command does (run_stage).
  logging.set_verbosity(logging.WARNING)
  started = common.provenance()
  profile = QUICK if args.quick else FULL
  results = run(profile, args.workdir, args.verbose)
  out = common.out_dir(args.out, "detection", args.workdir, args.quick)
  if out == common.results_dir("detection"):  # the committed results: with the fingerprint
    quick = run(QUICK, os.path.join(args.workdir, "fingerprint"), args.verbose)
    fingerprint.attach(results, quick, stage_flags(FULL, WORKDIR))
  _report(results, out)
  _examples(profile, os.path.join(args.workdir, results["best_vit"]), out)
  common.write_results(os.path.join(out, "results.json"), results, started)
  print(f"results.json, table.md, detection.png and examples.png in {out}")
  return results


def table(results: dict) -> str:
  """Markdown: one row per encoder and the baseline; AP, AP50, AP75 and wall time."""
  lines = [
    "| encoder | steps × batch | AP | AP50 | AP75 | wall time |",
    "|---|---|---|---|---|---|",
  ]
  profile = results["profile"]
  rows = [
    (
      title,
      f"{profile[budget]} × {profile['batch_size']}",
      results["runs"][e],
      results["seconds"][e],
    )
    for e, (title, _, _, budget) in ENCODERS.items()
  ]
  rows.append(
    (
      "connected components + 5-NN on pixels (no learning)",
      "",
      results["baseline"],
      results["seconds"]["baseline"],
    )
  )
  for title, budget, m, seconds in rows:
    lines.append(
      f"| {title} | {budget} | {m['AP']:.3f} | {m['AP50']:.3f} | {m['AP75']:.3f} | "
      f"{common.fmt_seconds(seconds)} |"
    )
  return "\n".join(lines)


def _report(results: dict, out: str) -> None:
  text = table(results)
  pretrain = results["pretrain"]
  print(
    f"\n== Pretraining on Fashion-MNIST: val top-1 {pretrain.get('val/accuracy', float('nan')):.1%}"
    f", {common.fmt_seconds(results['seconds']['pretrain'])}"
  )
  b = results["baseline"]
  print(
    f"\n== {DATASET} {results['profile']['test_split']}: COCO box AP ({b['num_images']} "
    f"canvases, {b['num_boxes']} boxes); the baseline's threshold {b['threshold']:+.2f}"
  )
  print(text)
  pre, scratch = results["runs"]["vit_pretrained"], results["runs"]["vit_scratch"]
  print(f"Pretraining bought {pre['AP'] - scratch['AP']:+.3f} AP over scratch.")
  common.finish_report(results, text, out)
  _plot(results, os.path.join(out, "detection.png"))


def _plot(results: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  p = results["profile"]
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  x = np.arange(len(ENCODERS))
  for i, (key, colour) in enumerate((("AP", "C0"), ("AP50", "C1"))):
    values = [results["runs"][e][key] for e in ENCODERS]
    ax.bar(x + (i - 0.5) * 0.38, values, 0.38, label=key, color=colour)
    ax.axhline(
      results["baseline"][key], color=colour, linestyle="--", label=f"baseline {key} (no learning)"
    )
  ax.set_xticks(x, [title.replace(", ", "\n") for title, *_ in ENCODERS.values()], fontsize=8)
  ax.set_ylabel(f"test box AP ({p['test_split']})")
  ax.set_title(
    f"Detecting Fashion-MNIST items ({p['steps']} or {p['bit_steps']} steps × "
    f"{p['batch_size']} canvases, 2 CPU cores)",
    fontsize=10,
  )
  ax.legend(fontsize=8)
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _examples(profile: Profile, checkpoint: str, out: str, count: int = 8, zoom: int = 3) -> None:
  """examples.png: `count` test canvases, each with its ground-truth boxes and, beside it, the
  detections (score >= MIN_SCORE) of the detect workdir `checkpoint` (inference.Detector)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from PIL import Image

  from vit_jax import inference
  from vit_jax.evaluators import detection as det_eval
  from vit_jax.input_pipeline.sources import detection_synthetic

  images, objects, _ = detection_synthetic.get_split(DATASET, profile.test_split)
  images, objects = images[:count], objects[:count]
  detector = inference.Detector(checkpoint)
  canvases = [Image.fromarray(im[..., 0]) for im in images]
  found = detector.detect(canvases)

  def drawn(image, boxes, classes, labels):
    big = image.resize((image.width * zoom, image.height * zoom), Image.NEAREST)
    return inference.draw_boxes(big, np.asarray(boxes).reshape(-1, 4) * zoom, labels, classes)

  columns = 4  # two canvases a row, each as (ground truth, detections)
  lines = -(-len(canvases) // 2)
  fig, axes = plt.subplots(lines, columns, figsize=(2.2 * columns, 2.3 * lines), squeeze=False)
  for i, (image, rows, d) in enumerate(zip(canvases, objects, found, strict=True)):
    h, w = image.height, image.width
    truth = [int(k) for k in rows[:, 4]]
    gt = det_eval.to_coco_bbox(rows[:, :4], 1, 1)  # the canvas's own pixels
    keep = d["scores"] >= MIN_SCORE
    boxes = det_eval.to_coco_bbox(d["boxes"][keep], h, w)
    classes = [int(k) for k in d["classes"][keep]]
    labels = [
      f"{detector.name(k)} {s:.2f}" for k, s in zip(classes, d["scores"][keep], strict=True)
    ]
    pair = (
      ("ground truth", drawn(image, gt, truth, [detector.name(k) for k in truth])),
      (f"detections (score ≥ {MIN_SCORE})", drawn(image, boxes, classes, labels)),
    )
    for j, (title, picture) in enumerate(pair):
      ax = axes[i // 2, (i % 2) * 2 + j]
      ax.imshow(picture)
      ax.set_title(title, fontsize=7)
  for ax in axes.ravel():
    ax.axis("off")
  fig.suptitle(f"Test canvases: {os.path.basename(checkpoint)}'s detections", fontsize=9)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "examples.png"), dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  cli.run(main, "experiments.detection", define_flags)
