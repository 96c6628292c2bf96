"""The numbers behind the ViT paper's §4.5 (Fig. 6–7), as pure numpy functions.

`filter_pca` (Fig. 7 left), `posemb_similarity` and `posemb_grid_summary` (Fig. 7 centre),
`mean_attention_distance` (Fig. 7 right) and `attention_rollout` (Fig. 6).

Conventions. Patches are in row-major order on a [gh, gw] token grid, with `num_prefix_tokens`
(1 for a class token, else 0) non-grid tokens in front. Distances are in input pixels: one grid
step is `stride` pixels (the patch size for a ViT, patch size times the ResNet stem's
downsampling for a hybrid). This file must import neither TensorFlow nor matplotlib.
"""

import jax
import jax.numpy as jnp
import numpy as np


def grid_coordinates(grid: tuple[int, int]) -> np.ndarray:
  """(row, column) of each patch of a [gh, gw] grid in row-major order: [gh * gw, 2]."""
  gh, gw = grid
  rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  return np.stack([rows.ravel(), cols.ravel()], axis=-1).astype(np.float64)


def patch_distances(grid: tuple[int, int], stride: float = 1.0) -> np.ndarray:
  """Euclidean distances between patch centres, in pixels: [gh * gw, gh * gw]."""
  xy = grid_coordinates(grid)
  return stride * np.sqrt(((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1))


def uniform_attention_distance(grid: tuple[int, int], stride: float) -> float:
  """The mean attention distance of a head that attends uniformly to all patches (pixels).

  The reference for `mean_attention_distance`: a head below it attends locally.
  """
  return float(patch_distances(grid, stride).mean())


def _check_attention(attention: np.ndarray, name: str = "attention") -> None:
  if attention.ndim < 2 or attention.shape[-1] != attention.shape[-2]:
    raise ValueError(f"{name} has shape {attention.shape}; expected [..., tokens, tokens]")


# ---------------------------------------------------------------------------------------------
# Attention maps: jax.numpy, so that they run jitted next to the model on sharded attention
# weights (only these small results leave the devices); numpy inputs work as well.


def mean_attention_distance(
  attention: jax.Array | np.ndarray,
  grid: tuple[int, int],
  stride: float,
  num_prefix_tokens: int = 1,
) -> tuple[jax.Array, jax.Array]:
  """Attention-weighted distance from each query patch to the key patches.

  For a query patch q, the distance is sum_k a(q, k) d(q, k) over the key patches k, with
  d the Euclidean distance between patch centres in pixels and a the attention weights
  renormalised over the patches: a class token has no place in the image, so its key is left
  out (its share of the attention is returned separately) and it is not a query.

  Args:
    attention: softmax weights [..., tokens, tokens] (e.g. [batch, heads, T, T]), rows = queries.
    grid: (gh, gw) with gh * gw = tokens - num_prefix_tokens.
    stride: pixels per grid step.
    num_prefix_tokens: leading tokens that are not patches.

  Returns:
    (distance [..., gh * gw] per query patch in pixels, prefix share [..., gh * gw]: the
    attention each query patch gives to the prefix tokens before renormalisation).
  """
  _check_attention(attention)
  n = grid[0] * grid[1]
  if attention.shape[-1] != num_prefix_tokens + n:
    raise ValueError(
      f"attention over {attention.shape[-1]} tokens does not match a {grid[0]}x{grid[1]} grid "
      f"with {num_prefix_tokens} prefix token(s)"
    )
  attention = jnp.asarray(attention, jnp.float32)
  patches = attention[..., num_prefix_tokens:, :]  # [..., n queries, T keys]
  prefix_share = patches[..., :num_prefix_tokens].sum(-1)
  weights = patches[..., num_prefix_tokens:]  # [..., n, n]
  total = weights.sum(-1, keepdims=True)
  weights = weights / jnp.where(total > 0, total, 1.0)
  distance = (weights * jnp.asarray(patch_distances(grid, stride), jnp.float32)).sum(-1)
  return distance, prefix_share


def attention_rollout(
  attentions: jax.Array | np.ndarray, residual_weight: float = 0.5, num_prefix_tokens: int = 1
) -> tuple[jax.Array, jax.Array]:
  """Attention rollout (Abnar & Zuidema, 2020) through all layers.

  Heads are fused by their mean. Each layer's residual connection is accounted for by mixing
  in the identity, A' = (1 - w) A + w I with w = `residual_weight` (0.5: the paper's and the
  original's choice), and rows are renormalised to sum to 1. The rollout is A'_L ... A'_2 A'_1.

  Args:
    attentions: [layers, batch, heads, tokens, tokens], layer 0 the first (closest to input).
    residual_weight: w above.
    num_prefix_tokens: 1 with a class token (the map is read from its row); 0 for a
      global-average-pooled model (the map is the mean of all rows, what the pool sees).

  Returns:
    (patch map [batch, tokens - num_prefix_tokens]: how much each patch flows into the pooled
    output, summing with the prefix tokens' share to 1; the full rollout [batch, tokens, tokens]).
  """
  if attentions.ndim != 5:
    raise ValueError(f"attentions have shape {attentions.shape}; expected [L, batch, heads, T, T]")
  _check_attention(attentions, "attentions")
  attentions = jnp.asarray(attentions, jnp.float32)
  tokens = attentions.shape[-1]
  eye = jnp.eye(tokens, dtype=jnp.float32)
  rollout = jnp.broadcast_to(eye, attentions.shape[1:2] + (tokens, tokens))
  for layer in range(attentions.shape[0]):
    fused = (1.0 - residual_weight) * attentions[layer].mean(axis=1) + residual_weight * eye
    fused = fused / fused.sum(-1, keepdims=True)  # [batch, T, T]
    rollout = fused @ rollout  # A'_l (A'_{l-1} ... A'_1)
  source = rollout[:, 0] if num_prefix_tokens else rollout.mean(axis=1)
  return source[:, num_prefix_tokens:], rollout


# ---------------------------------------------------------------------------------------------
# Position embeddings (Fig. 7 centre).


def posemb_similarity(posemb: np.ndarray, num_prefix_tokens: int = 1) -> np.ndarray:
  """Cosine similarity between the position embeddings of every pair of patches.

  Args:
    posemb: [1, tokens, D] or [tokens, D], the class token's slot (if any) first.
    num_prefix_tokens: leading slots that are not patches (dropped).

  Returns:
    [patches, patches], patches in row-major grid order.
  """
  posemb = np.asarray(posemb, np.float64)
  if posemb.ndim == 3:
    if posemb.shape[0] != 1:
      raise ValueError(f"posemb has shape {posemb.shape}; expected [1, tokens, D]")
    posemb = posemb[0]
  if posemb.ndim != 2:
    raise ValueError(f"posemb has shape {posemb.shape}; expected [tokens, D]")
  patches = posemb[num_prefix_tokens:]
  norms = np.linalg.norm(patches, axis=-1, keepdims=True)
  unit = patches / np.where(norms > 0, norms, 1.0)
  return np.clip(unit @ unit.T, -1.0, 1.0)


def posemb_grid_summary(similarity: np.ndarray, grid: tuple[int, int]) -> dict:
  """Numbers that say whether the position embeddings learned the 2-D grid.

  Args:
    similarity: [gh * gw, gh * gw] from `posemb_similarity`.
    grid: (gh, gw).

  Returns:
    dict: `distance_correlation`, the Pearson correlation between the similarity and the grid
    distance over pairs of distinct patches (strongly negative: nearby patches are similar);
    `same_row`, `same_column`, `other`: the mean similarity of distinct pairs sharing a row,
    sharing a column, or neither; `by_distance`: mean similarity per grid distance (rounded to
    2 decimals, as a string key) up to 4 steps.
  """
  n = grid[0] * grid[1]
  if similarity.shape != (n, n):
    raise ValueError(f"similarity has shape {similarity.shape}; expected ({n}, {n})")
  xy = grid_coordinates(grid)
  distance = patch_distances(grid)
  off = ~np.eye(n, dtype=bool)
  same_row = (xy[:, None, 0] == xy[None, :, 0]) & off
  same_col = (xy[:, None, 1] == xy[None, :, 1]) & off
  other = off & ~same_row & ~same_col

  def mean(mask):
    return float(similarity[mask].mean()) if mask.any() else float("nan")

  s, d = similarity[off], distance[off]
  corr = float(np.corrcoef(s, d)[0, 1]) if n > 2 and s.std() > 0 and d.std() > 0 else float("nan")
  by_distance = {}
  for value in np.unique(np.round(d, 2)):
    if value <= 4.0:
      by_distance[f"{value:.2f}"] = mean(off & (np.round(distance, 2) == value))
  return dict(
    distance_correlation=corr,
    same_row=mean(same_row),
    same_column=mean(same_col),
    other=mean(other),
    by_distance=by_distance,
  )


# ---------------------------------------------------------------------------------------------
# Patch-embedding filters (Fig. 7 left).


def filter_pca(kernel: np.ndarray, num_components: int = 28) -> tuple[np.ndarray, np.ndarray]:
  """Principal components of the patch-embedding filters.

  Each of the D output units of the embedding is a filter of p x p x C weights; the filters are
  centred over the D units and the top right-singular vectors of the [D, p*p*C] matrix are the
  components.

  Args:
    kernel: the embedding kernel [p, p, C, D].
    num_components: how many to return (at most min(D, p*p*C)).

  Returns:
    (components [k, p, p, C], each of unit norm and with the sign that makes its largest entry
    positive; explained variance ratio [k]).
  """
  kernel = np.asarray(kernel, np.float64)
  if kernel.ndim != 4:
    raise ValueError(f"embedding kernel has shape {kernel.shape}; expected [p, p, C, D]")
  ph, pw, c, d = kernel.shape
  filters = kernel.reshape(ph * pw * c, d).T  # [D, p*p*C]
  filters = filters - filters.mean(axis=0, keepdims=True)
  _, singular, vt = np.linalg.svd(filters, full_matrices=False)
  variance = singular**2
  ratio = variance / variance.sum() if variance.sum() > 0 else np.zeros_like(variance)
  k = min(num_components, vt.shape[0])
  components = vt[:k]
  flip = np.sign(components[np.arange(k), np.abs(components).argmax(axis=1)])
  components = components * np.where(flip == 0, 1.0, flip)[:, None]
  return components.reshape(k, ph, pw, c), ratio[:k]
