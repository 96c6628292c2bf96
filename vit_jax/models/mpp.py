"""Masked patch prediction: the paper's self-supervised pretraining objective (§4.6, App. B.1.2).

"We corrupt 50% of patch embeddings by either replacing their embeddings with a learnable [mask]
embedding (80%), a random other patch embedding (10%) or just keeping them as is (10%) ... predict
the 3-bit, mean color (i.e., 512 colors in total) of every corrupted patch using their respective
patch representations." The appendix compares three targets, all available here:

  mean_color     the 3-bit mean colour of the patch: one softmax over 512 colours (the default);
  downsample4x4  the patch downsized to 4×4 with 3-bit colours: 16 softmaxes over 512 colours;
  l2             the full patch, regressed with a squared error (patch² × 3 values in [-1, 1]).

`corrupt` chooses exactly round(rate × patches) patches per image, keyed by the example id; only
chosen patches enter the loss. `MaskedPatchPredictor` adds `mask_embedding` and `mpp_head` to the
ViT's names (vit_jax.checkpoint.load_pretrained drops the two for fine-tuning); its pre-logits are
the mean patch token, since this objective never trains the class token. No R50 hybrids.

This file must not import TensorFlow.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.models import build, vit

TARGETS = ("mean_color", "downsample4x4", "l2")
# The parameters the model adds to the ViT's (dropped where a checkpoint is read as a plain ViT).
MASK_EMBEDDING, HEAD = "mask_embedding", "mpp_head"
PARAMS = (MASK_EMBEDDING, HEAD)
COLOR_BITS = 3
NUM_COLORS = 2 ** (3 * COLOR_BITS)  # 512
# Kinds of patch after `corrupt`.
KEPT_CLEAN, MASKED, RANDOM, KEPT_CORRUPTED = 0, 1, 2, 3


def mpp_config(
  target: str = "mean_color",
  corrupt_rate: float = 0.5,
  mask_rate: float = 0.8,
  random_rate: float = 0.1,
) -> ml_collections.ConfigDict:
  """`config.mpp` of a stage with `config.loss = 'mpp'` (defaults: the paper's)."""
  return ml_collections.ConfigDict(
    dict(target=target, corrupt_rate=corrupt_rate, mask_rate=mask_rate, random_rate=random_rate)
  )


# ---------------------------------------------------------------------------------------------
# Targets (from the input image, values in [-1, 1]).


def patches(images: jax.Array, patch_size: int) -> jax.Array:
  """[batch, H, W, C] → [batch, patches, p, p, C] in the row-major order of the patch embedding."""
  b, h, w, c = images.shape
  p = patch_size
  gh, gw = h // p, w // p
  x = images[:, : gh * p, : gw * p].reshape(b, gh, p, gw, p, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, p, p, c)


def quantize(values: jax.Array) -> jax.Array:
  """Values in [-1, 1] → int32 levels 0..7 (3 bits, equal-width bins of [0, 1])."""
  levels = 2**COLOR_BITS
  return jnp.clip(jnp.floor((values + 1.0) / 2.0 * levels), 0, levels - 1).astype(jnp.int32)


def color_index(rgb_levels: jax.Array) -> jax.Array:
  """[..., 3] levels 0..7 → one of 512 colours: r·64 + g·8 + b."""
  levels = 2**COLOR_BITS
  return (rgb_levels[..., 0] * levels + rgb_levels[..., 1]) * levels + rgb_levels[..., 2]


def targets(images: jax.Array, patch_size: int, target: str) -> jax.Array:
  """The prediction targets of every patch.

  Returns:
    mean_color: int32 [batch, patches]; downsample4x4: int32 [batch, patches, 16];
    l2: float32 [batch, patches, p·p·3].
  """
  x = patches(images.astype(jnp.float32), patch_size)  # [B, N, p, p, 3]
  if target == "mean_color":
    return color_index(quantize(jnp.mean(x, axis=(2, 3))))
  if target == "downsample4x4":
    b, n, p, _, c = x.shape
    if p % 4:
      raise ValueError(f"mpp target downsample4x4 needs a patch size divisible by 4, got {p}")
    s = p // 4
    cells = jnp.mean(x.reshape(b, n, 4, s, 4, s, c), axis=(3, 5))  # [B, N, 4, 4, 3]
    return color_index(quantize(cells)).reshape(b, n, 16)
  if target == "l2":
    return x.reshape(x.shape[0], x.shape[1], -1)
  raise ValueError(f"mpp target {target!r}; expected one of {TARGETS}")


def num_outputs(target: str, patch_size: int) -> int:
  """Width of the `mpp_head` for `target`."""
  if target == "mean_color":
    return NUM_COLORS
  if target == "downsample4x4":
    return 16 * NUM_COLORS
  if target == "l2":
    return patch_size * patch_size * 3
  raise ValueError(f"mpp target {target!r}; expected one of {TARGETS}")


# ---------------------------------------------------------------------------------------------
# Corruption.


def corrupt(
  key: jax.Array,
  x: jax.Array,
  mask_embedding: jax.Array,
  corrupt_rate: float = 0.5,
  mask_rate: float = 0.8,
  random_rate: float = 0.1,
  example_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Corrupts patch embeddings as App. B.1.2 describes (jittable).

  Image i draws from fold_in(key, example_ids[i]) (None: its row). Of x [batch, patches, D],
  round(corrupt_rate × patches) per image are chosen; each becomes `mask_embedding` [D] with
  probability mask_rate, another patch of the same image with random_rate, else stays. Returns
  (the corrupted x, kind int32 [batch, patches]: KEPT_CLEAN, MASKED, RANDOM or KEPT_CORRUPTED).
  """
  b, n, _ = x.shape
  ids = jnp.arange(b) if example_ids is None else example_ids

  def draws(image_key):
    k_choose, k_kind, k_other = jax.random.split(image_key, 3)
    return (
      jax.random.uniform(k_choose, (n,)),
      jax.random.uniform(k_kind, (n,)),
      jax.random.randint(k_other, (n,), 1, max(n, 2)),
    )

  scores, u, shift = jax.vmap(draws)(jax.vmap(jax.random.fold_in, (None, 0))(key, ids))
  num = int(round(corrupt_rate * n))
  # Exactly `num` chosen per image: the patches of the `num` smallest uniform scores.
  ranks = jnp.argsort(jnp.argsort(scores, axis=1), axis=1)
  chosen = ranks < num
  kind = jnp.where(
    u < mask_rate, MASKED, jnp.where(u < mask_rate + random_rate, RANDOM, KEPT_CORRUPTED)
  )
  kind = jnp.where(chosen, kind, KEPT_CLEAN).astype(jnp.int32)
  # Another patch of the same image: shift the index by 1..n-1 (never the patch itself).
  other = (jnp.arange(n)[None, :] + shift) % n
  replaced = jnp.take_along_axis(x, other[..., None], axis=1)
  out = jnp.where((kind == MASKED)[..., None], mask_embedding.astype(x.dtype), x)
  out = jnp.where((kind == RANDOM)[..., None], replaced, out)
  return out, kind


# ---------------------------------------------------------------------------------------------
# The model.


class MaskedPatchPredictor(vit.VisionTransformer):
  """A ViT with a [mask] embedding and a per-patch head: logits [batch, patches, num_outputs].

  Only with `train` is the image corrupted (under the 'mpp' rng, else a fixed key); otherwise
  every `kind` is KEPT_CLEAN and the pre-logits are the clean image's.
  """

  target: str = "mean_color"
  corrupt_rate: float = 0.5
  mask_rate: float = 0.8
  random_rate: float = 0.1

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool, example_ids: vit.Ids = None) -> vit.Output:
    mask_embedding = self.param(
      MASK_EMBEDDING, nn.initializers.normal(0.02), (self.hidden_size,), self.param_dtype
    )
    kinds = []

    def corrupt_fn(x):
      key = self.make_rng("mpp") if self.has_rng("mpp") else jax.random.PRNGKey(0)
      rates = (self.corrupt_rate, self.mask_rate, self.random_rate)
      out, kind = corrupt(key, x, mask_embedding, *rates, example_ids)
      kinds.append(kind)
      return out

    fn = corrupt_fn if train else None
    _, out = self.encode(images, train=train, example_ids=example_ids, corrupt_fn=fn)
    tokens = out["tokens"]
    width = num_outputs(self.target, self.patch_size)
    head = nn.Dense(width, dtype=self.dtype, param_dtype=self.param_dtype, name=HEAD)
    out["kind"] = kinds[0] if kinds else jnp.zeros(tokens.shape[:2], jnp.int32)
    out["pre_logits"] = jnp.mean(tokens, axis=1)
    return head(tokens).astype(jnp.float32), out


def get_model(
  model_config: ml_collections.ConfigDict, mpp: ml_collections.ConfigDict, mesh: Any = None
) -> MaskedPatchPredictor:
  """The MPP model of a ViT preset config (`config.model`) and `config.mpp`, for `mesh` (see
  vit_jax.models.get_model)."""
  if mpp.target not in TARGETS:
    raise ValueError(f"config.mpp.target={mpp.target!r}; expected one of {TARGETS}")
  backbone = build.get_model(model_config, None, mesh=mesh)
  if backbone.resnet is not None:
    raise ValueError("masked patch prediction needs image patches; R50 hybrids are not supported")
  rates = {k: float(mpp[k]) for k in ("corrupt_rate", "mask_rate", "random_rate")}
  return MaskedPatchPredictor(**vit.settings(backbone), target=mpp.target, **rates)
