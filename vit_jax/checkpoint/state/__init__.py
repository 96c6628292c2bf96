"""The trainer's fault-tolerant state: Orbax checkpoints of a workdir and a local tier.

  train_state     the workdir's Orbax checkpoints (saves, keep-N, resume), `restore_params`
  restore_faults  what a failed restore says of the step: evidence that it is broken, or retry
  storage_wait    a restore or save that waits on storage: a line every 30 s, a stop honoured
  local_tier      frequent saves of each process's own shards to its own disk

Nothing here reads parameter files (vit_jax.checkpoint.weights).
"""
