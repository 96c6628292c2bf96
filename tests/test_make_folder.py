"""vit_jax/tools/make_folder.py: bundled datasets as image folders that the folder sources read."""

import subprocess
import sys

import numpy as np
import pytest

from vit_jax.input_pipeline.sources import builtin, segmentation, segmentation_synthetic
from vit_jax.tools import make_folder


def test_segmentation_folder_reads_back_as_the_synthetic_split(tmp_path):
  root = str(tmp_path / "seg")
  make_folder.write_segmentation("animal_mnist_seg", root, ["val"], max_examples=3)
  want = segmentation_synthetic.synthetic_split("animal_mnist_seg", "val")
  names = segmentation.folder_listing(root, "val")
  # Three canvases spread over the split: its first, middle and last.
  last = len(want.masks) - 1
  assert names == [f"{i:05d}.png" for i in (0, round(last / 2), last)]
  assert segmentation.folder_class_names(root) == segmentation_synthetic.synthetic_class_names(
    "animal_mnist_seg"
  )
  for name in names:
    i = int(name[:5])
    _, image, mask = segmentation.read_folder_example(root, "val", name, num_classes=11)
    np.testing.assert_array_equal(image[..., 0], want.images[i][..., 0])  # grey, as RGB
    np.testing.assert_array_equal(mask, want.masks[i])


def test_a_written_split_is_never_overwritten(tmp_path):
  root = str(tmp_path / "digits")
  make_folder.write_classification("digits", root, ["test"], max_examples=5)
  files = sorted(p.name for p in (tmp_path / "digits" / "test").rglob("*.png"))
  assert len(files) == 5
  names = builtin.load("digits").class_names
  assert {p.parent.name for p in (tmp_path / "digits" / "test").rglob("*.png")} <= set(names)
  with pytest.raises(FileExistsError, match="test exists; nothing was written"):
    make_folder.write_classification("digits", root, ["train", "test"])
  assert not (tmp_path / "digits" / "train").exists()  # checked before anything is written
  proc = subprocess.run(
    [sys.executable, "-m", "vit_jax.tools.make_folder", "--dataset=digits", f"--out={root}",
     "--split=test"],
    capture_output=True, text=True,
  )  # fmt: skip
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
    f"make_folder: error: FileExistsError: {root}/test exists; nothing was written"
  )
  assert sorted(p.name for p in (tmp_path / "digits" / "test").rglob("*.png")) == files
