"""PNG figures of the analysis (matplotlib, Agg backend: no display needed).

Each function takes the numbers of vit_jax.analysis.metrics and writes one PNG, `path`, with
`title` as a line above the figure, and returns `path`; none computes anything the JSON does not
hold. This file must not import JAX or TensorFlow.
"""

import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 — after choosing the backend
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

DPI = 100


def _save(fig, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=DPI, bbox_inches="tight")
  plt.close(fig)
  return path


def _unit_range(x: np.ndarray) -> np.ndarray:
  lo, hi = float(x.min()), float(x.max())
  return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def filters(components: np.ndarray, explained: np.ndarray, path: str, title: str = "") -> str:
  """The principal components of the embedding filters as RGB images (paper Fig. 7 left).

  Args:
    components: [k, p, p, C]; each is shown min-max scaled to [0, 1] on its own.
    explained: [k] explained variance ratios.
  """
  k = len(components)
  cols = min(k, 7)
  rows = -(-k // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(1.1 * cols, 1.25 * rows + 0.4), squeeze=False)
  for i, ax in enumerate(axes.flat):
    ax.set_axis_off()
    if i < k:
      image = _unit_range(components[i])
      ax.imshow(
        image if image.shape[-1] == 3 else image[..., 0], cmap="gray", interpolation="nearest"
      )
      ax.set_title(f"{100 * explained[i]:.1f}%", fontsize=7)
  fig.suptitle(title or "Embedding filters: principal components (variance explained)", fontsize=9)
  return _save(fig, path)


def posemb_similarity(
  similarity: np.ndarray, grid: tuple[int, int], path: str, title: str = ""
) -> str:
  """One small map per patch: its position embedding's cosine similarity to all (Fig. 7 centre).

  Args:
    similarity: [gh * gw, gh * gw] from metrics.posemb_similarity.
    grid: (gh, gw).
  """
  gh, gw = grid
  maps = similarity.reshape(gh, gw, gh, gw)
  # One mosaic image with a one-pixel gap between the maps: one imshow, any grid size.
  mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
  for r in range(gh):
    for c in range(gw):
      mosaic[r * (gh + 1) : r * (gh + 1) + gh, c * (gw + 1) : c * (gw + 1) + gw] = maps[r, c]
  side = min(8.0, max(3.5, 0.45 * max(gh, gw)))
  fig, ax = plt.subplots(figsize=(side + 1.0, side * gh / gw))
  cmap = plt.get_cmap("viridis").with_extremes(bad="white")
  im = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
  ax.set_xticks([c * (gw + 1) + (gw - 1) / 2 for c in range(gw)], range(1, gw + 1), fontsize=6)
  ax.set_yticks([r * (gh + 1) + (gh - 1) / 2 for r in range(gh)], range(1, gh + 1), fontsize=6)
  ax.set_xlabel("input patch column")
  ax.set_ylabel("input patch row")
  ax.tick_params(length=0)
  for spine in ax.spines.values():
    spine.set_visible(False)
  fig.colorbar(im, ax=ax, fraction=0.04, label="cosine similarity")
  ax.set_title(title or "Position embedding similarity", fontsize=9)
  return _save(fig, path)


def attention_distance(
  distance: np.ndarray, uniform: float | None, path: str, title: str = ""
) -> str:
  """Mean attention distance of every head against depth (Fig. 7 right).

  Args:
    distance: [layers, heads] in pixels.
    uniform: the distance of uniform attention (a dashed line), or None.
  """
  layers, heads = distance.shape
  fig, ax = plt.subplots(figsize=(4.2, 3.2))
  depth = np.repeat(np.arange(1, layers + 1), heads)
  colors = plt.get_cmap("tab10")(np.tile(np.arange(heads) % 10, layers))
  ax.scatter(depth, distance.ravel(), s=14, c=colors, alpha=0.85, edgecolors="none")
  ax.plot(np.arange(1, layers + 1), distance.mean(1), color="gray", lw=1, label="mean of heads")
  if uniform is not None:
    ax.axhline(uniform, color="black", ls="--", lw=0.8, label="uniform attention")
  ax.set_xlabel("network depth (layer)")
  ax.set_ylabel("mean attention distance (pixels)")
  ax.set_xticks(range(1, layers + 1) if layers <= 16 else range(1, layers + 1, 2))
  ax.set_ylim(0, 1.15 * max(float(distance.max()), uniform or 0.0))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="lower right")
  ax.set_title(title or "Mean attention distance, one dot per head", fontsize=9)
  return _save(fig, path)


def _mask(rollout: np.ndarray, grid: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
  """The rollout map [gh * gw] scaled to max 1 and resized (bilinear) to the image [h, w]."""
  m = rollout.reshape(grid).astype(np.float32)
  m = m / m.max() if m.max() > 0 else m
  return np.asarray(Image.fromarray(m, mode="F").resize(size[::-1], Image.Resampling.BILINEAR))


def rollout(
  images: Sequence[np.ndarray],
  maps: Sequence[np.ndarray],
  grid: tuple[int, int],
  names: Sequence[str],
  path: str,
  title: str = "",
) -> str:
  """Attention rollout overlaid on images (Fig. 6): input, heat map, input times the map.

  Args:
    images: [h, w, 3] model inputs (any value range; shown min-max scaled).
    maps: [gh * gw] rollout maps from metrics.attention_rollout.
    grid: (gh, gw).
    names: a caption per image.
  """
  n = len(images)
  fig, axes = plt.subplots(3, n, figsize=(1.3 * n + 0.6, 4.3), squeeze=False)
  for i, (image, m, name) in enumerate(zip(images, maps, names, strict=True)):
    image = _unit_range(np.asarray(image, np.float32))
    mask = _mask(np.asarray(m), grid, image.shape[:2])
    axes[0, i].imshow(image)
    axes[0, i].set_title(name[:14], fontsize=6)
    axes[1, i].imshow(image.mean(-1), cmap="gray")
    axes[1, i].imshow(mask, cmap="inferno", alpha=0.6, vmin=0, vmax=1)
    axes[2, i].imshow(image * mask[..., None])
    for ax in axes[:, i]:
      ax.set_axis_off()
  for row, label in enumerate(("input", "rollout", "input x rollout")):
    axes[row, 0].text(
      -0.1,
      0.5,
      label,
      transform=axes[row, 0].transAxes,
      rotation=90,
      ha="right",
      va="center",
      fontsize=7,
    )
  fig.suptitle(title or "Attention rollout from the class token", fontsize=9)
  return _save(fig, path)
