r"""Entry point of every stage: `python -m vit_jax.main --config=... --workdir=...`.

The config (configs/*.py, installed as vit_jax.configs; a file of the user's own:
vit_jax.runtime.config_files) names its stage: 'pretrain', 'finetune', 'segment' and 'detect'
run vit_jax.train, 'linear_probe' runs vit_jax.linear_probe (vit_jax.stages, the same as a library).
Fields are overridden with `--config.field=value`; a misspelt field is an error naming the
nearest one. The terminal shows progress, metrics, warnings and errors, the log file the rest
(vit_jax.runtime.console; `--verbose`: everything on the terminal). Multi-host runs, the lost
process timeout and the workdir's lock (`--break_lock`): docs/training.md.

Examples:
  python -m vit_jax.main --config=configs/pretrain.py:dataset=fashion_mnist --workdir=/tmp/pt
  python -m vit_jax.main --config=configs/finetune.py:dataset=cifar10,model=B/16 \
      --config.model_init=gs://vit_models/imagenet21k/ViT-B_16.npz --workdir=gs://bucket/ft
"""

if __name__ == "__main__":  # the command's process, set up before any thread starts
  from vit_jax.runtime import process

  process.configure()

from absl import logging

from vit_jax.runtime import cli

define_flags = cli.define_flags(
  config=cli.config_flag,
  workdir=cli.WORKDIR,
  distributed=cli.DistributedFlags.define,
  break_lock=cli.Flag(
    False,
    "Remove the workdir's lock whoever holds it, then run (for a run known to be gone whose "
    "lease has not expired yet; a live run's lock is never taken over without it).",
  ),
  verbose=cli.Flag(False, "Every log line on the terminal (default: to the workdir's log file)."),
)


def main(argv, f):
  cli.no_arguments(argv)

  def stage():
    from vit_jax import stages
    from vit_jax.runtime import startup

    config = f.config.value
    # TensorFlow and the rest, imported without the garbage collector (vit_jax.runtime.startup).
    startup.import_module(stages.module_name(config.stage))
    import jax

    if f.break_lock.value and jax.process_index() == 0:
      from vit_jax.runtime import workdir_lock

      logging.warning("%s", workdir_lock.break_lock(f.workdir.value))
    logging.info("config:\n%s", config, extra={"terminal": False})
    logging.info(
      "%s: model %s on %s, %s steps, workdir %s",
      config.stage,
      config.model.get("name") if config.get("model") else "from model_init",
      config.dataset.name,
      config.get("total_steps", "-"),
      f.workdir.value,
    )
    stages.run_and_record(config, f.workdir.value)

  cli.run_stages(stage, f.workdir.value, f.distributed, verbose=f.verbose.value)


if __name__ == "__main__":
  cli.run(main, "vit_jax", define_flags)
