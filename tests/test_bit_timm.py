"""An independent implementation reads our BiT files: timm's ResNetV2 must give the same logits.

`checkpoint.save` writes a random BiT-R50x1 in the published BiT layout (`resnet/...`), timm's
`resnetv2_50x1_bit` reads it with its own loader for the published BiT files
(`_load_weights(model, path, prefix='resnet/')`), and the logits of both implementations are
compared on the same images. Needs the optional `timm` and `torch` (the `[timm]` extra); skipped
without them, and marked slow (run with `pytest -m slow`). timm runs in a child process, as in
test_timm_equivalence.py (PyTorch and TensorFlow crash in one process).
"""

import importlib.util
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import checkpoint, models
from vit_jax.models import bit

pytestmark = pytest.mark.slow

NUM_CLASSES = 37
TOLERANCE = 1e-5  # max abs logit difference

_TIMM_LOGITS = r"""
import sys
import numpy as np
import timm
import torch
from timm.layers import StdConv2d
from timm.models.resnetv2 import _load_weights

npz, images, out, num_classes, ws_eps = sys.argv[1:]
torch.set_num_threads(2)
model = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=int(num_classes))
model.double()  # before loading, so the file's float32 values are copied exactly
_load_weights(model, npz, prefix="resnet/")
# An architecture constant no file carries: BiT's code standardises with eps 1e-10, timm's port
# with 1e-8.
for module in model.modules():
  if isinstance(module, StdConv2d):
    module.eps = float(ws_eps)
model.eval()
with torch.no_grad():
  x = torch.from_numpy(np.load(images)).permute(0, 3, 1, 2).double()  # NHWC -> NCHW
  np.save(out, model(x).numpy())
"""


def _random_params(model, image_size, seed=0):
  """Random float32 values for every leaf, including the head (zero in a real init)."""
  images = jnp.zeros((1, image_size, image_size, 3))
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), images, train=False))["params"]
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = rng.standard_normal(leaf.shape, np.float32)
    name = jax.tree_util.keystr(path)
    if "gamma" in name:
      return 1.0 + 0.1 * noise
    return (0.1 if "beta" in name else 0.02) * noise

  return jax.tree_util.tree_map_with_path(draw, shapes)


def test_bit_r50x1_matches_timm(tmp_path):
  for module in ("timm", "torch"):
    if importlib.util.find_spec(module) is None:
      pytest.skip(f"{module} is not installed (the optional [timm] extra)")
  # 160px: odd feature maps (5x5 in block 4) exercise the padding; float64 on both sides,
  # as for the hybrid: the 16 units amplify float32 rounding differences towards 1e-5.
  image_size = 160
  model = models.get_model("BiT-R50x1", NUM_CLASSES)
  params = _random_params(model, image_size)
  path = tmp_path / "bit.npz"
  checkpoint.save(params, path)  # float32, as the published files

  images = np.random.default_rng(1).uniform(-1, 1, (2, image_size, image_size, 3))
  images = images.astype(np.float32)
  np.save(tmp_path / "images.npy", images)
  args = [path, tmp_path / "images.npy", tmp_path / "timm.npy", NUM_CLASSES, bit.WS_EPS]
  subprocess.run([sys.executable, "-c", _TIMM_LOGITS, *map(str, args)], check=True, timeout=900)
  theirs = np.load(tmp_path / "timm.npy")
  with jax.enable_x64(True):
    model64 = models.get_model("BiT-R50x1", NUM_CLASSES, dtype=jnp.float64, param_dtype=jnp.float64)
    params64 = jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), params)
    ours = np.asarray(
      jax.jit(lambda p, x: model64.apply({"params": p}, x, train=False)[0])(
        params64, jnp.asarray(images, jnp.float64)
      )
    )
  assert ours.shape == theirs.shape == (2, NUM_CLASSES)
  assert np.abs(ours).max() > 0.1  # a meaningful check: the head is not zero
  diff = float(np.abs(ours - theirs).max())
  print(f"\nBiT-R50x1 vs timm resnetv2_50x1_bit (float64): max abs logit difference {diff:.3g}")
  assert diff < TOLERANCE
