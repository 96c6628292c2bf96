"""The trainer of the pretrain, fine-tune, segment and detect stages: `run(config, workdir)`.

  step.py   the train step: `make_train_step`, and `build` → `Setup` (model, optimizer, state
            shapes and shardings, the step: what `run` trains and the planner compiles); the
            metrics window
  saver.py  `Saver`: saving and restoring the state in both checkpoint tiers, stop-then-save
  loop.py   `run`: setup, then the loop (a step; at log steps the window's means; the saves due;
            the evaluations due)
  model_init.py  the starting point: parameters from `config.model_init` (or fresh), adapted to
            the stage's model
  optim.py  optimizers and learning-rate schedules of the paper's recipes
  ema.py    Polyak averaging of the parameters
  mixup.py  mixup and cutmix of the global training batch, inside the step

It runs on any mesh (vit_jax.sharding), on one or many processes, and resumes from the latest
complete checkpoint in the workdir, bitwise equal to an uninterrupted run on the same topology and
the same trajectory up to floating-point summation order on any other (docs/training.md,
"Topology"). What keeps it so: the examples of step s are positions s·B .. s·B + B − 1 of the
run's stream (the iterator state saved with each checkpoint is that position), laid out in that
order in the global batch; every random draw for an example is keyed on the seed, the step and
its index in the global batch (`batch['index']`), never on its row in a micro-batch, so
`accum_steps` does not change them. Nothing depends on wall-clock time or on how often metrics
are fetched.

Metrics: each step adds its sums to an on-device window that the host reads and resets at
every log step, so a logged loss or accuracy is the mean over the window's examples
(vit_jax.train.step). The model, the per-example loss and what counts as correct come from the
objective of `config.loss` or `config.distill` (vit_jax.objectives; a teacher's parameters are
the step's 4th argument). Images/s and MFU count only time spent training, on the goodput
account's clock (vit_jax.runtime.goodput).

Workdir: a config that differs from the workdir's `config.json` in a field that may not change
on resume stops the run before anything is touched (vit_jax.runtime.workdir). A step whose loss
or gradient norm is not finite stops the run (FloatingPointError naming the step) before it is
saved. SIGTERM, SIGINT or a preemption notice make every process save the same step and raise
`stopping.Stopped` (vit_jax.runtime.stopping); killed without notice, a run resumes from the
latest complete checkpoint (vit_jax.checkpoint.state.train_state). docs/training.md, "Stopping,
faults and recovery". A run restarted after its last step runs its evaluators on the final
state and returns their metrics (what vit_jax.main records).
"""

import importlib

# The trainer's names, each from its module, imported when first used: `vit_jax.train.optim`
# (which the configs read) does not import the loop, the input pipeline and TensorFlow.
_EXPORTS = {
  "run": "loop",
  "State": "step",
  "Setup": "step",
  "Window": "step",
  "abstract_window": "step",
  "build": "step",
  "empty_window": "step",
  "make_train_step": "step",
  "window_metrics": "step",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'vit_jax.train' has no attribute {name!r}")
  return getattr(importlib.import_module(f"vit_jax.train.{_EXPORTS[name]}"), name)
