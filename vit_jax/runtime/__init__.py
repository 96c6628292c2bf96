"""A stage's process around the training: its command line, terminal, hosts, stops and workdir.

  cli           a command's flags, the distributed flags, and its one-line end on an error
  config_files  the `--config` flag: which file a config path names, and bad overrides
  console       what reaches the terminal, and the log file that keeps everything else
  distributed   connecting the processes of a multi-host run, and agreeing on values between them
  stopping      SIGTERM / SIGINT turned into a stop at a step every process saves
  workdir       a workdir's config.json and final metrics, atomic JSON writes
  workdir_lock  one writer per workdir, held as a lease its holder renews
  json_file     a JSON file of a known shape: read it or say why in one line, set one aside
  liveness      a lost process of a multi-process run ends the others, with one line naming it
  startup       a stage's modules imported without the cyclic garbage collector, then frozen
  gcs           gs:// specifics: the client library, bucket and credential checks, atomic create
  logging_util  metric writers, the progress line, parameter overview, MFU
  goodput       where a run's wall time goes, accumulated over a workdir's reruns
  profiling     jax.profiler traces of chosen steps, from the config or a request file
  process       a command's process settings, in one call (`configure()`)
  libtpu_lock   compiling for TPU topologies beside other libtpu processes; a held lock in one line

This package must not import TensorFlow.
"""
