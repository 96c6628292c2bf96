"""Preprocessing: the one registry and parser of op strings, and the ops of each kind of data.

  registry      the registry of ops by kind and the parser of their strings
  preprocess    the tf.data ops on one image (`pp_train`, `pp_eval` of classification)
  pil           the deterministic evaluation ops on a PIL image, for predict
  segmentation  the ops on an image and its mask together, in numpy
  detection     the ops on an image and its boxes together, in numpy
  randaugment   RandAugment on uint8 images with stateless randomness
  image_header  the pixel count an encoded image declares, read without decoding it

This file imports nothing: the parser and the PIL ops run without TensorFlow.
"""
