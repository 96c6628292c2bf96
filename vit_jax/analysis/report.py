"""`analyze`: a checkpoint and images in, the figures and `analysis.json` out.

Reads the images in batches (an unreadable one is skipped, counted and named), accumulates the
attention statistics on the devices, computes the weight-only numbers (embedding filters,
position embeddings) on the host, and writes:

  <out>/analysis.json             the numbers (see `analyze`)
  <out>/analysis.npz              the arrays behind the figures (similarity, rollout maps, ...)
  <out>/filters_pca.png           principal components of the embedding filters (not hybrids)
  <out>/posemb_similarity.png     position-embedding cosine similarity, one map per patch
  <out>/attention_distance.png    mean attention distance per head against depth
  <out>/attention_rollout.png     rollout on the first images; rollout/<i>_<name>.png each

This file must not import TensorFlow.
"""

import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging
from PIL import Image

from vit_jax import inference
from vit_jax.analysis import capture, metrics, plots

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
ROLLOUT_FIGURE_IMAGES = 8  # images in attention_rollout.png
PROGRESS_SECONDS = 10.0


# ---------------------------------------------------------------------------------------------
# Images.


def list_images(specs: Sequence[str]) -> list[str]:
  """Files named in `specs`: files as given, folders searched (recursively, sorted) for images.

  Raises:
    FileNotFoundError: naming the first spec that does not exist.
  """
  paths = []
  for spec in specs:
    if os.path.isdir(spec):
      found = []
      for root, _, files in os.walk(spec):
        found += [os.path.join(root, f) for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
      if not found:
        raise FileNotFoundError(f"--images: no {'/'.join(IMAGE_EXTENSIONS)} files in {spec}")
      paths += sorted(found)
    elif os.path.exists(spec):
      paths.append(spec)
    else:
      raise FileNotFoundError(f"--images: no such file or folder: {spec}")
  return paths


def _read(path: str, image_size: int, pp: str) -> np.ndarray:
  with Image.open(path) as image:
    image.load()
    return inference.preprocess(image, image_size, pp)


def _batches(
  paths: Sequence[str], batch_size: int, image_size: int, pp: str, skipped: list[tuple[str, str]]
) -> Iterator[tuple[list[str], np.ndarray]]:
  """Yields (names, [n <= batch_size, size, size, 3]); appends unreadable files to `skipped`."""
  names, arrays = [], []
  for path in paths:
    try:
      arrays.append(_read(path, image_size, pp))
      names.append(path)
    except inference.UNREADABLE as e:
      skipped.append((path, inference.why_unreadable(e)))
    if len(arrays) == batch_size:
      yield names, np.stack(arrays)
      names, arrays = [], []
  if arrays:
    yield names, np.stack(arrays)


def _attention(
  subject: capture.Subject,
  paths: Sequence[str],
  batch_size: int,
  residual_weight: float,
  keep_images: int,
) -> dict[str, Any]:
  """Runs the images through the model; returns the accumulated statistics and rollout maps."""
  multiple = subject.batch_multiple()
  batch_size = -(-max(batch_size, 1) // multiple) * multiple
  layers, heads = subject.num_layers, subject.num_heads
  distance, share = np.zeros((layers, heads)), np.zeros((layers, heads))
  names: list[str] = []
  maps, kept = [], []
  skipped: list[tuple[str, str]] = []
  start = last_log = time.perf_counter()
  for batch_names, batch in _batches(paths, batch_size, subject.image_size, subject.pp, skipped):
    n = len(batch)
    valid = np.arange(batch_size) < n
    padded = np.concatenate([batch, np.zeros((batch_size - n, *batch.shape[1:]), batch.dtype)])
    stats = subject.attention_statistics(padded, valid, residual_weight)
    distance += stats["distance_sum"]
    share += stats["prefix_share_sum"]
    maps.append(stats["rollout"][:n])
    names += batch_names
    kept += list(batch[: max(0, keep_images - len(kept))])
    now = time.perf_counter()
    done = len(names) + len(skipped)
    if now - last_log > PROGRESS_SECONDS or (done == len(paths) and now - start > PROGRESS_SECONDS):
      rate = len(names) / (now - start)
      logging.info(
        "analysis: %d/%d images, %.1f images/s, ETA %.0fs",
        done,
        len(paths),
        rate,
        (len(paths) - done) / max(rate, 1e-9),
      )
      last_log = now
  if skipped:
    logging.warning("%s", inference.skipped_line(skipped, len(paths)))
  if not names:
    raise ValueError(f"none of the {len(paths)} images could be read")
  return dict(
    names=names,
    skipped=skipped,
    distance=distance / len(names),
    prefix_share=share / len(names),
    rollout=np.concatenate(maps),
    images=kept,
  )


def analyze(
  checkpoint: str,
  images: Sequence[str],
  out: str,
  *,
  model: str | None = None,
  image_size: int = 0,
  batch_size: int = 32,
  residual_weight: float = 0.5,
  num_components: int = 28,
  max_rollout_images: int = 64,
  fsdp: int = 1,
  model_parallel: int = 1,
) -> dict[str, Any]:
  """Writes the figures, `analysis.json` and `analysis.npz` to `out`; returns the JSON's dict.

  Args:
    checkpoint: a workdir, step directory or `.npz`.
    images: image files and folders (empty: only the weight figures).
    out: the output folder.
    model: a preset for a checkpoint without `config.json` (required for hybrids).
    image_size: input side; 0: the checkpoint's own.
    batch_size: images per forward pass (rounded up to a multiple of the batch shards).
    residual_weight: attention rollout's identity weight.
    num_components: principal components of the embedding filters to show.
    max_rollout_images: per-image rollout figures to write (the first ones).
    fsdp: the mesh's 'fsdp' axis size (shards the parameters of a large model).
    model_parallel: the mesh's 'model' axis size.

  Returns:
    The numbers: `model`, the token geometry, `mean_attention_distance` [layers][heads] in
    pixels (and `class_token_attention`, the share of attention patches give the class
    token), `rollout` (how it was computed; the maps are in the .npz), `posemb` (grid summary),
    `filters` (explained variance, or why skipped), `images` (counts, skipped files), `figures`.
  """
  paths = list_images(images)
  subject = capture.load(checkpoint, model, image_size, fsdp, model_parallel)
  os.makedirs(out, exist_ok=True)
  params = subject.checkpoint_params
  prefix = subject.num_prefix_tokens
  config = subject.model_config
  # Titles name the architecture too: a preset's name stays when its fields are overridden.
  name = (
    f"{config.get('name') or 'ViT'} ({config.num_layers} layers, width {config.hidden_size}, "
    f"{config.num_heads} heads, {subject.stride}px tokens)"
  )
  result: dict[str, Any] = dict(
    checkpoint=str(checkpoint),
    model=config.get("name") or "ViT",
    hidden_size=int(config.hidden_size),
    layers=subject.num_layers,
    heads=subject.num_heads,
    image_size=subject.image_size,
    preprocessing=subject.pp,
    token_grid=list(subject.grid),
    token_stride_pixels=subject.stride,
    class_token=bool(prefix),
    figures={},
  )
  arrays: dict[str, np.ndarray] = {}

  # 1. Embedding filters.
  kernel = np.asarray(params["embedding"]["kernel"])
  if subject.is_hybrid or kernel.shape[2] != 3:
    reason = (
      f"the embedding of {result['model']} is a {kernel.shape[0]}x{kernel.shape[1]} conv on "
      f"{kernel.shape[2]} {'ResNet feature' if subject.is_hybrid else 'input'} channels, "
      "not on RGB pixels: no filter figure"
    )
    logging.info("analysis: %s", reason)
    result["filters"] = dict(skipped=reason)
  else:
    components, explained = metrics.filter_pca(kernel, num_components)
    arrays["filter_components"] = components
    result["filters"] = dict(
      kernel_shape=list(kernel.shape), explained_variance_ratio=explained.tolist()
    )
    result["figures"]["filters"] = plots.filters(
      components,
      explained,
      os.path.join(out, "filters_pca.png"),
      f"{name}\nembedding filters, top {len(components)} principal components",
    )

  # 2. Position embeddings, on the grid they were trained for.
  posemb = np.asarray(params["Transformer"]["posembed_input"]["pos_embedding"])
  similarity = metrics.posemb_similarity(posemb, prefix)
  arrays["posemb_similarity"] = similarity
  result["posemb"] = dict(
    grid=list(subject.posemb_grid),
    class_token_slot_dropped=bool(prefix),
    **metrics.posemb_grid_summary(similarity, subject.posemb_grid),
  )
  result["figures"]["posemb_similarity"] = plots.posemb_similarity(
    similarity,
    subject.posemb_grid,
    os.path.join(out, "posemb_similarity.png"),
    f"{name}\nposition embedding similarity ({subject.posemb_grid[0]}x{subject.posemb_grid[1]})",
  )

  # 3-4. Attention, over the images.
  if paths:
    keep = max(max_rollout_images, ROLLOUT_FIGURE_IMAGES)
    att = _attention(subject, paths, batch_size, residual_weight, keep)
    result["images"] = dict(
      count=len(att["names"]),
      skipped_count=len(att["skipped"]),
      skipped=[dict(path=p, error=why) for p, why in att["skipped"]],
    )
    result["mean_attention_distance"] = att["distance"].tolist()
    result["mean_attention_distance_per_layer"] = att["distance"].mean(1).tolist()
    uniform = metrics.uniform_attention_distance(subject.grid, subject.stride)
    result["uniform_attention_distance"] = uniform
    result["mean_attention_distance_definition"] = (
      "per head: sum over key patches of attention x distance between patch centres (pixels), "
      "attention renormalised over patches (class token key left out), averaged over query "
      "patches and images"
    )
    if prefix:
      result["class_token_attention"] = att["prefix_share"].tolist()
    source = "class token" if prefix else "mean over tokens (global average pool)"
    result["rollout"] = dict(
      method="Abnar & Zuidema attention rollout",
      head_fusion="mean",
      residual=f"A' = {1 - residual_weight:g} A + {residual_weight:g} I, rows renormalised",
      source=source,
      maps="analysis.npz: rollout [images, gh*gw], rollout_images",
    )
    arrays["mean_attention_distance"] = att["distance"]
    arrays["rollout"] = att["rollout"]
    arrays["rollout_images"] = np.array(att["names"])
    result["figures"]["attention_distance"] = plots.attention_distance(
      att["distance"],
      uniform,
      os.path.join(out, "attention_distance.png"),
      f"{name}\nmean attention distance ({len(att['names'])} images, {subject.image_size}px)",
    )
    shown = att["images"]
    labels = [os.path.splitext(os.path.basename(p))[0] for p in att["names"]]
    title = (
      f"{name}\nattention rollout from the {source} (heads: mean; residual: {residual_weight:g} I)"
    )
    k = min(len(shown), ROLLOUT_FIGURE_IMAGES)
    result["figures"]["attention_rollout"] = plots.rollout(
      shown[:k],
      att["rollout"][:k],
      subject.grid,
      labels[:k],
      os.path.join(out, "attention_rollout.png"),
      title,
    )
    for i, image in enumerate(shown[:max_rollout_images]):
      plots.rollout(
        [image],
        att["rollout"][i : i + 1],
        subject.grid,
        [labels[i]],
        os.path.join(out, "rollout", f"{i:04d}_{labels[i]}.png"),
        f"rollout: {labels[i]}",
      )
    if max_rollout_images > 0:
      result["figures"]["rollout_per_image"] = os.path.join(out, "rollout")
  else:
    result["images"] = dict(count=0, skipped_count=0, skipped=[])

  np.savez_compressed(os.path.join(out, "analysis.npz"), **arrays)
  result = _finite(result)
  with open(os.path.join(out, "analysis.json"), "w") as f:
    json.dump(result, f, indent=2, allow_nan=False)
  return result


def _finite(tree: Any) -> Any:
  """NaN (e.g. a grid summary of a one-row grid) → None, so the file is strict JSON."""
  if isinstance(tree, dict):
    return {k: _finite(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_finite(v) for v in tree]
  if isinstance(tree, float) and not np.isfinite(tree):
    return None
  return tree
