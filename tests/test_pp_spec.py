"""The preprocessing-spec parser shared by the tf.data pipeline and predict (no `ast`)."""

import pytest

from vit_jax.input_pipeline import pp_spec


def test_parses_ops_with_literal_arguments():
  assert pp_spec.parse("decode|resize(224)|value_range(-1, 1)") == [
    ("decode", (), {}),
    ("resize", (224,), {}),
    ("value_range", (-1, 1), {}),
  ]
  assert pp_spec.parse(" inception_crop | flip_lr ") == [
    ("inception_crop", (), {}),
    ("flip_lr", (), {}),
  ]
  assert pp_spec.parse("x(2, -.5, 1e-3, size=(3, 4), mode='a', on=True, off=None)") == [
    ("x", (2, -0.5, 0.001), {"size": (3, 4), "mode": "a", "on": True, "off": None})
  ]


@pytest.mark.parametrize(
  "spec", ["resize(1", "a b", "resize(x=1, 2)", "3(1)", "resize(1))", "f(g)", "", " | "]
)
def test_bad_specs_name_the_op(spec):
  with pytest.raises(ValueError, match="Cannot parse|Empty"):
    pp_spec.parse(spec)


def test_module_does_not_use_ast():
  import pathlib

  source = pathlib.Path(pp_spec.__file__).read_text()
  assert "import ast" not in source
