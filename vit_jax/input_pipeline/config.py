"""The dataset section of a config: `dataset_config(**overrides)` lists every field the pipeline reads."""

import ml_collections
from ml_collections import config_dict


def dataset_config(**overrides) -> ml_collections.ConfigDict:
  """Returns a locked ConfigDict with every input pipeline field (defaults: ImageNet via tfds).

  Fields:
    source: 'tfrecord' | 'tfds' | 'folder' | 'builtin', or for per-pixel labels 'seg_builtin' |
      'seg_folder' | 'seg_shards' (the table of sources: vit_jax.input_pipeline.sources.registry).
    name: tfds name ('cifar10', 'oxford_iiit_pet', ...), builtin name ('fashion_mnist',
      'animal_mnist', 'mnist_5k', 'digits'), or the shards' prefix for `file_pattern`.
    data_dir: tfds data_dir; the directory of the shards (local or gs://) for 'tfrecord' and
      'seg_shards'; the root `root/<split>/<class>/*.jpg` for 'folder', `root/<split>/images/`
      and `masks/` for 'seg_folder'.
    train_split, eval_split: split names. Every source but 'tfrecord' accepts slices
      ('train[:99%]', 'train[:3750]'; but for tfds, slices are ranges of a fixed shuffle, see
      vit_jax.input_pipeline.splits); for 'tfrecord' a split containing '/' or a glob character
      is used as the file pattern itself.
    file_pattern: 'tfrecord' only: glob of a split's shards under data_dir, with {name} and {split}.
    image_key, label_key: tf.train.Example / tfds feature keys; None = 'image/encoded' and
      'image/class/label' for 'tfrecord', 'image' and 'label' for 'tfds'.
    vtab_task: 'tfds' only: None, or a VTAB-1k task of `vit_jax.input_pipeline.sources.vtab` (e.g.
      'clevr_count'): its label transform and class count replace `label_key`'s, and the
      prepared data's split sizes are checked against the task's (name is the task's builder).
    multi_label: labels are lists → multi-hot float targets [K] (sigmoid cross-entropy).
    num_classes: None = from the dataset's info (tfds info, dataset_info.json, class folders).
    shuffle_buffer: raw (encoded) records in the shuffle buffer of the sources read per host
      ('tfrecord', 'seg_shards', 'tfds'); the sources addressed by index are fully permuted
      every epoch.
    image_size: output resolution, and the default size of every sizing op in the pp specs.
    pp_train, pp_eval: preprocessing specs, see `vit_jax.input_pipeline.ops.preprocess`.
    mixup_alpha: > 0 enables mixup (Beta(alpha, alpha)) of the global training batch, done by the
      trainer on device (vit_jax.train.mixup); the pipeline's labels stay as they are.
    cutmix_alpha: > 0 enables CutMix (Yun et al. 2019; Beta(alpha, alpha), one box per step),
      likewise on device (vit_jax.train.mixup). With both alphas > 0 each step does one of the two,
      CutMix with probability 0.5 (timm's switch_prob). 0 (the default) is off; < 0 is an error.
    max_skipped_fraction: the share of skipped examples (undecodable, too large, lost with a
      damaged file) among the records a host read above which the run stops, checked once the
      host read 1,000 records or one epoch (vit_jax.input_pipeline.bad_data). 0.001: a curated
      dataset skips few if any, and a larger share is a data problem to fix (a damaged shard, a
      folder of unreadable files) rather than noise to train through; raise it for web data.
    max_image_pixels: images whose header declares more pixels are skipped without decoding
      (0: no bound). 100 million: a decode costs 3 bytes per pixel and runs several at once, so
      this caps one at 0.3 GB; it is above the photos of common cameras and near Pillow's own
      default (89.5 million); a few hundred bytes of PNG can declare 30,000 × 30,000 = 900
      million.
    num_threads: tf.data threads per host; 0 = one per core.
    prefetch: batches prefetched onto the devices ahead of the train step.

  Args:
    **overrides: field values to set (unknown names raise).

  Returns:
    The locked ConfigDict.
  """
  c = ml_collections.ConfigDict()
  c.source = "tfds"
  c.name = "imagenet2012"
  c.data_dir = config_dict.placeholder(str)
  c.train_split = "train[:99%]"
  c.eval_split = "validation"
  c.file_pattern = "{name}-{split}.tfrecord*"
  c.image_key = config_dict.placeholder(str)
  c.label_key = config_dict.placeholder(str)
  c.vtab_task = config_dict.placeholder(str)
  c.multi_label = False
  c.num_classes = config_dict.placeholder(int)
  c.shuffle_buffer = 50_000
  c.image_size = 224
  c.pp_train = "decode|inception_crop|flip_lr|value_range(-1, 1)"
  c.pp_eval = "decode|resize_small|central_crop|value_range(-1, 1)"
  c.mixup_alpha = 0.0
  c.cutmix_alpha = 0.0
  c.max_skipped_fraction = 0.001
  c.max_image_pixels = 100_000_000
  c.num_threads = 0
  c.prefetch = 2
  c.lock()
  c.update(overrides)
  return c
