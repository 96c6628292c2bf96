"""Where examples come from, whatever their task: one contract, one table of sources by name.

  base                    the contract every source implements (Source, IndexedSource)
  registry                the one table of sources, by the name `dataset.source` gives
  indexed                 the sources addressed by index: image folders (`folder`, `seg_folder`,
                          `det_folder`) and the bundled arrays (`builtin`, `seg_builtin`,
                          `det_builtin`)
  shards                  TFRecord shards: `tfrecord` (classification), `seg_shards`, `det_shards`
  tfrecord_files          reading one TFRecord file record by record, for the shards
  tfds_source             a prepared TensorFlow Datasets dataset in `data_dir` (`tfds`)
  vtab                    the 19 tasks of VTAB-1k as google-research/task_adaptation defines them
  builtin                 the bundled offline datasets, read into numpy (no TensorFlow)
  segmentation_synthetic  the offline synthetic segmentation tasks, made from the bundled images
  segmentation            segmentation data: decoding, checks, folders and shards' keys
  detection_synthetic     the offline synthetic detection tasks, made from the bundled images
  detection               detection data: annotations, their checks, COCO folders, shards' keys

This file imports nothing: `builtin` and the synthetic tasks are read without TensorFlow.
"""
