"""For the timm child processes of the slow tests: make timm's R50 hybrid compute vit_jax's stem.

Architecture constants, not weights, so no file carries them: the official vit_jax code (and
ours) standardises conv kernels as (w - mean) / (std + 1e-5), timm's hybrid as
(w - mean) / sqrt(var + 1e-8); GroupNorm eps is 1e-6 in flax, 1e-5 in torch. With these set,
a comparison measures the architecture and the weight mapping alone. Imports torch and timm:
never imported by the test process itself (torch and TensorFlow crash in one process).
"""

import torch
import torch.nn.functional as F
from timm.layers import StdConv2d, StdConv2dSame
from timm.layers.padding import pad_same


def _official_forward(self, x):
  if getattr(self, "same_pad", False):
    x = pad_same(x, self.kernel_size, self.stride, self.dilation)
  w = self.weight
  mean = w.mean(dim=(1, 2, 3), keepdim=True)
  std = w.std(dim=(1, 2, 3), keepdim=True, unbiased=False)
  w = (w - mean) / (std + 1e-5)
  return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


def use_vit_jax_constants(model: torch.nn.Module) -> None:
  """Rewires `model`'s hybrid stem in place to vit_jax's standardisation and GroupNorm eps."""
  for module in model.patch_embed.backbone.modules():
    if isinstance(module, (StdConv2d, StdConv2dSame)):
      module.forward = _official_forward.__get__(module)
    elif isinstance(module, torch.nn.GroupNorm):
      module.eps = 1e-6
