"""The trainer's fault-tolerant state: Orbax checkpoints of a workdir and a local tier.

  train_state     the workdir's Orbax checkpoints (async saves, keep-N, resume, data position),
                  and `restore_params` of one of them
  restore_faults  what a failed restore of a step says about that step (evidence that it is
                  broken, or an error to retry)
  storage_wait    a restore or save that waits on storage: a line every 30 s, a stop honoured
  local_tier      frequent saves of each process's own shards to its own disk, and restoring
                  the newest step of either tier

Nothing here reads parameter files (vit_jax.checkpoint.weights).
"""
