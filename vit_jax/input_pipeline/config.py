"""The dataset section of a config: `dataset_config(**overrides)` lists every field the pipeline reads."""

import ml_collections
from ml_collections import config_dict


def dataset_config(**overrides) -> ml_collections.ConfigDict:
  """A locked ConfigDict with every input pipeline field (defaults: ImageNet via tfds), the
  `overrides` set (unknown names raise). What each field means: docs/data.md, "The fields of
  `config.dataset`"."""
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
  c.max_boxes = 100
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
