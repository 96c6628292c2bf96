"""What a run meets in its data, through the entry point (vit_jax.input_pipeline.bad_data):

- an image file that cannot be read ends the run, after the retries, in one line naming it;
- an image declaring 30,000 x 30,000 pixels is skipped without decoding and the run goes on, and
  an evaluation that could not read every example of its split fails in one line;
- a damaged shard's lost records, counted from dataset_info.json, take the share of skipped
  examples past the limit: the run stops in one line naming the count, the share and the file;
- the segment stage, on a segmentation folder, the same way.

Each is `python -m vit_jax.main` on a folder or shards of a few images ('testing' ViT, runlocal);
the counting itself is tested in-process (test_bad_data.py).
"""

import pathlib
import re
import subprocess
import sys

import numpy as np
from test_image_header import bomb_png  # tests/

from tests.helpers import REPO, synthetic_data, xla_env
from vit_jax.checkpoint.state import train_state
from vit_jax.tools import make_shards

ARGS = [
  "--config=configs/pretrain.py:dataset=fashion_mnist,runlocal",
  "--config.total_steps=4",
  "--config.batch_size=8",
  "--config.evals.fewshot_animal_mnist.every_steps=-1",
  "--config.evals.fewshot_mnist_5k.every_steps=-1",
]


def _main(workdir, *extra, base=ARGS) -> tuple[int, str, str]:
  """(exit status, last terminal line, the whole output) of the entry point, its flags `base`
  (the pretraining config's) and `extra`."""
  proc = subprocess.run(
    [sys.executable, "-m", "vit_jax.main", *base, f"--workdir={workdir}", *extra],
    env=xla_env.child_env(1, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu"),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
  print(f"exit {proc.returncode}: {lines[-1]}")  # shown with -s: the closing note's figures
  return proc.returncode, lines[-1], proc.stdout + proc.stderr


def _folder(root: pathlib.Path) -> list[str]:
  """train/ 2 classes x 10 images, val/ 2 x 3: the flags that train on it."""
  synthetic_data.write_image_folder(str(root), "train", ["a", "b"], per_class=10)
  synthetic_data.write_image_folder(str(root), "val", ["a", "b"], per_class=3, seed=1)
  return [
    "--config.dataset.source=folder",
    f"--config.dataset.data_dir={root}",
    "--config.dataset.train_split=train",
    "--config.dataset.eval_split=val",
  ]


def test_an_unreadable_image_file_ends_the_run_in_one_line(tmp_path):
  flags = _folder(tmp_path / "folder")
  gone = tmp_path / "folder" / "train" / "b" / "2.png"
  gone.unlink()
  gone.mkdir()  # listed as an image; reading it fails however often it is tried
  code, last, _ = _main(tmp_path / "workdir", *flags)
  assert code == 1
  assert last.startswith(
    f"vit_jax: error: DataReadError: cannot read {gone} (4 attempts): FailedPreconditionError: "
    f"{gone}; Is a directory"
  )
  assert not train_state.committed_steps(tmp_path / "workdir")


def test_a_bomb_is_skipped_and_an_evaluation_short_of_its_split_fails(tmp_path):
  """A PNG declaring 30,000 x 30,000 pixels among the training images is skipped (named,
  counted) and training goes on to its last step; an undecodable image in the evaluation split
  makes the final evaluation fail in one line, after that step was saved."""
  flags = _folder(tmp_path / "folder")
  bomb = tmp_path / "folder" / "train" / "a" / "bomb.png"
  bomb.write_bytes(bomb_png())
  broken = tmp_path / "folder" / "val" / "b" / "broken.png"
  broken.write_bytes(b"not an image")
  workdir = tmp_path / "workdir"
  # One skipped example of the 21 of an epoch is 4.8%: allowed here, to see the run go on.
  code, last, output = _main(
    workdir, *flags, "--config.dataset.max_skipped_fraction=0.1", "--config.evals.val.every_steps=0"
  )
  assert (
    f"input pipeline: skipped {bomb}: it declares 900,000,000 pixels, more than "
    "dataset.max_image_pixels=100,000,000" in output
  )
  assert train_state.committed_steps(workdir)[-1] == 4  # trained to the end
  assert code == 1
  assert last.startswith(
    "vit_jax: error: IncompleteEvaluationError: evaluation of split 'val' read 6 of the 7 "
    f"examples of this host: 1 skipped (1 undecodable); the most recent: {broken}, which could "
    "not be decoded or preprocessed; an evaluation needs every example of its split"
  )


def test_a_damaged_shard_stops_the_run_past_the_limit_in_one_line(tmp_path):
  root = tmp_path / "photos"
  synthetic_data.write_image_folder(str(root), "train", ["a", "b"], per_class=10)
  paths = make_shards.shard_folder(str(root), "train", str(tmp_path / "shards"), num_shards=4)
  data = bytearray(pathlib.Path(paths[2]).read_bytes())
  data[len(data) // 2] ^= 0xFF  # a CRC mismatch in one of its 5 records
  pathlib.Path(paths[2]).write_bytes(bytes(data))
  read = sum(1 for _ in _records_before_damage(paths[2]))
  code, last, output = _main(
    tmp_path / "workdir",
    "--config.dataset.source=tfrecord",
    "--config.dataset.name=photos",
    f"--config.dataset.data_dir={tmp_path / 'shards'}",
    "--config.dataset.train_split=train",
    "--config.dataset.eval_split=train",
    "--config.evals.val.every_steps=-1",
  )
  assert f"input pipeline: {paths[2]} is damaged after record {read} (DataLossError: " in output
  assert f"its last {5 - read} of 5 records are lost, counted as skipped examples" in output
  assert code == 1
  # Stopped once the host read its epoch (20 records, listed), the limit 0.1%.
  match = re.match(
    r"vit_jax: error: TooManySkippedError: input pipeline: (\d+) of the 24 examples this host "
    r"read \((\d+\.\d\d)%\) were skipped \((\d+) lost in damaged files\), more than "
    r"dataset.max_skipped_fraction=0.001; the most recent: (.*) record \d+, which was lost "
    r"with the rest of its damaged TFRecord file",
    last,
  )
  assert match, last
  skipped = int(match.group(1))
  assert skipped >= 5 - read and match.group(3) == match.group(1) and match.group(4) == paths[2]
  assert match.group(2) == f"{100 * skipped / 24:.2f}"


def _records_before_damage(path):
  import tensorflow as tf

  try:
    yield from tf.compat.v1.io.tf_record_iterator(path)
  except tf.errors.DataLossError:
    return


def test_the_segment_stage_skips_a_bomb_and_its_evaluation_needs_every_example(tmp_path):
  """The same on a segmentation folder (`seg_folder`, streamed through the same pipeline): a
  training image declaring 30,000 x 30,000 pixels is skipped and the run trains to its last
  step; a validation image that does not decode fails the final evaluation in one line."""
  from PIL import Image

  root = tmp_path / "folder"
  rng = np.random.default_rng(0)
  for split, n in (("train", 15), ("val", 4)):
    for d in ("images", "masks"):
      (root / split / d).mkdir(parents=True)
    for i in range(n):
      Image.fromarray(rng.integers(0, 256, (16, 16, 3), np.uint8)).save(
        root / split / "images" / f"{i}.png"
      )
      Image.fromarray(rng.integers(0, 3, (16, 16), np.uint8)).save(
        root / split / "masks" / f"{i}.png"
      )
  (root / "classes.txt").write_text("bg\na\nb\n")
  bomb, broken = root / "train" / "images" / "bomb.png", root / "val" / "images" / "broken.png"
  bomb.write_bytes(bomb_png())
  broken.write_bytes(b"not an image")
  for split, name in (("train", "bomb"), ("val", "broken")):
    (root / split / "masks" / f"{name}.png").write_bytes(
      (root / split / "masks" / "0.png").read_bytes()
    )
  workdir = tmp_path / "workdir"
  code, last, output = _main(
    workdir,
    "--config=configs/segment.py:dataset=folder,runlocal",
    f"--config.dataset.data_dir={root}",
    "--config.init_from_scratch=true",
    "--config.dataset.image_size=16",
    "--config.total_steps=2",
    "--config.batch_size=8",
    "--config.dataset.max_skipped_fraction=0.1",  # 1 of the 16 training images
    "--config.evals.val.every_steps=0",
    "--config.evals.test.every_steps=-1",
    "--config.checkpoint.asynchronous=false",
    base=(),
  )
  assert (
    f"input pipeline: skipped {bomb}: it declares 900,000,000 pixels, more than "
    "dataset.max_image_pixels=100,000,000" in output
  )
  assert train_state.committed_steps(workdir)[-1] == 2  # trained to the end
  assert code == 1
  assert last.startswith(
    "vit_jax: error: IncompleteEvaluationError: evaluation of split 'val' read 4 of the 5 "
    f"examples of this host: 1 skipped (1 undecodable); the most recent: {broken}, which could "
    "not be decoded or preprocessed; an evaluation needs every example of its split"
  ), last
