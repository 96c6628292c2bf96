"""The one registry of preprocessing ops and parser of their strings, shared by the tf.data
pipeline, predict and segmentation (no `ast`)."""

import pytest
from PIL import Image

from vit_jax.input_pipeline.ops import pil, registry
from vit_jax.input_pipeline.ops import segmentation as seg_ops


def test_parses_ops_with_literal_arguments():
  assert registry.parse("decode|resize(224)|value_range(-1, 1)") == [
    ("decode", (), {}),
    ("resize", (224,), {}),
    ("value_range", (-1, 1), {}),
  ]
  assert registry.parse(" inception_crop | flip_lr ") == [
    ("inception_crop", (), {}),
    ("flip_lr", (), {}),
  ]
  assert registry.parse("x(2, -.5, 1e-3, size=(3, 4), mode='a', on=True, off=None)") == [
    ("x", (2, -0.5, 0.001), {"size": (3, 4), "mode": "a", "on": True, "off": None})
  ]


@pytest.mark.parametrize(
  "spec", ["resize(1", "a b", "resize(x=1, 2)", "3(1)", "resize(1))", "f(g)", "", " | "]
)
def test_bad_specs_name_the_op(spec):
  with pytest.raises(ValueError, match="Cannot parse|Empty"):
    registry.parse(spec)


def test_module_does_not_use_ast():
  import pathlib

  source = pathlib.Path(registry.__file__).read_text()
  assert "import ast" not in source


def test_each_kind_has_its_own_ops_and_binds_their_arguments():
  assert [name for name, _, _ in registry.parse("random_crop(0.5)|flip_lr", "segmentation")] == [
    "random_crop",
    "flip_lr",
  ]
  assert registry.parse("", "segmentation", empty_ok=True) == []
  with pytest.raises(ValueError, match="Unknown predict preprocessing op 'flip_lr'"):
    registry.parse("decode|flip_lr", "pil")
  with pytest.raises(TypeError, match="preprocessing op 'resize'"):
    registry.build("resize(1, 2, 3)", "pil")
  (step,) = registry.build("central_crop(size=0.5)", "pil")
  assert step(Image.new("RGB", (40, 30)), 20).size == (10, 10)  # half of image_size
  assert pil.preprocess(Image.new("L", (9, 7)), 4, "decode|resize").shape == (4, 4, 3)
  assert set(registry._OPS["segmentation"]) == {"random_crop", "flip_lr", "resize"}
  assert seg_ops.build("resize") and seg_ops.build("") == []
