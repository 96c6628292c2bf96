"""What the commands share: their flags, the flags of a multi-host run, and how a command ends
(one line naming what went wrong, its exit status).

Every command, of the package (all listed in vit_jax.tools) or an experiment
(`python -m experiments.<name>`), is a module with
  - a first statement that sets its process up when it runs as a command
    (vit_jax.runtime.process.configure, before anything else is imported);
  - `define_flags = cli.define_flags(name=Flag(...), ...)`, defining its flags in a FlagValues
    (absl's global one by default) and returning their holders;
  - `main(argv, flags)`, given the arguments left after the flags and those holders;
  - `cli.run(main, "<name>", define_flags)` under `if __name__ == "__main__"`.
Its flags exist only in the program that runs it, so importing a command module defines no flag;
`call(module, argv)` runs a command in this process, its flags in a FlagValues of their own.
The library code of a command lives in library modules (vit_jax.stages, vit_jax.inference, ...).
How a command's process ends: docs/process.md.

This file must not import TensorFlow.
"""

import atexit
import dataclasses
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app, flags, logging

from vit_jax.runtime import distributed


@dataclasses.dataclass(frozen=True)
class Flag:
  """One flag of a command (`define_flags`). Its kind is that of `default`: bool, int, float, str or
  list; a type (`str`) is that kind without a default; `choices` make it an enum, `multi` a
  repeatable string."""

  default: Any
  help: str
  required: bool = False
  choices: Sequence[str] | None = None
  multi: bool = False
  name: str = ""  # the flag's name where it is not its holder's (`--in`: `input`)

  def define(self, attr: str, values: flags.FlagValues) -> flags.FlagHolder:
    kind = self.default if isinstance(self.default, type) else type(self.default)
    default = None if isinstance(self.default, type) else self.default
    name, extra = self.name or attr, dict(required=self.required, flag_values=values)
    if self.choices is not None:
      return flags.DEFINE_enum(name, default, self.choices, self.help, **extra)
    if self.multi:
      return flags.DEFINE_multi_string(name, default, self.help, **extra)
    return _DEFINE[kind](name, default, self.help, **extra)


_DEFINE = {
  bool: flags.DEFINE_bool,
  int: flags.DEFINE_integer,
  float: flags.DEFINE_float,
  str: flags.DEFINE_string,
  list: flags.DEFINE_list,
}

# The flags of a checkpoint read as a model (vit_jax.inference: predict, analysis, export).
CHECKPOINT = Flag(str, "Workdir, step directory or .npz (local or gs://).", required=True)
MODEL = Flag(str, "A vit_jax.models preset (e.g. B/16) for an .npz without config.json.")
IMAGE_SIZE = Flag(
  0, "Input resolution; 0: the checkpoint's (config.json, else the position embeddings)."
)
CLASS_NAMES = Flag(str, "Text file with one class name a line (overrides the dataset's).")
BATCH_SIZE = Flag(32, "Images per forward pass.")
WORKDIR = Flag(
  str, "The run's workdir (local or gs://): checkpoints, metrics, logs.", required=True
)


def config_flag(values: flags.FlagValues) -> flags.FlagHolder:
  """The required `--config` of a stage config, and its `--config.<field>` overrides
  (vit_jax.runtime.config_files)."""
  from vit_jax.runtime import config_files

  holder = config_files.define_flag(flag_values=values)
  flags.mark_flag_as_required("config", flag_values=values)
  return holder


def define_flags(**specs: Flag | Callable[[flags.FlagValues], Any]):
  """A command's `define_flags`: given a FlagValues (absl's global one by default), it defines
  the flags `specs` name, one a keyword: a `Flag`, or a function that defines its own
  (`config_flag`, `DistributedFlags.define`); it returns their holders by keyword."""

  def define(values: flags.FlagValues = flags.FLAGS) -> types.SimpleNamespace:
    return types.SimpleNamespace(
      **{k: s.define(k, values) if isinstance(s, Flag) else s(values) for k, s in specs.items()}
    )

  return define


def no_arguments(argv: Sequence[str], hint: str = "") -> None:
  """Refuses arguments after the flags, for a command that takes none."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}{hint}")


@dataclasses.dataclass(frozen=True)
class DistributedFlags:
  """The flags of a multi-host run (vit_jax.runtime.distributed.initialize)."""

  mode: flags.FlagHolder
  coordinator_address: flags.FlagHolder
  num_processes: flags.FlagHolder
  process_id: flags.FlagHolder
  lost_process_timeout: flags.FlagHolder

  @classmethod
  def define(cls, values: flags.FlagValues = flags.FLAGS) -> "DistributedFlags":
    """Defines the five flags (once per program)."""
    specs = dict(
      mode=Flag(
        "auto",
        "jax.distributed.initialize: 'on' always (cluster auto-detection on TPU, SLURM, ...), "
        "'off' never, 'auto' when --coordinator_address is given or on a multi-host TPU VM "
        "slice.",
        choices=["auto", "on", "off"],
        name="distributed",
      ),
      coordinator_address=Flag(str, "host:port of process 0 (CPU/GPU clusters)."),
      num_processes=Flag(int, "Number of processes."),
      process_id=Flag(int, "Index of this process."),
      lost_process_timeout=Flag(
        distributed.LOST_PROCESS_TIMEOUT_S,
        "Seconds without a sign of life after which another process of the run counts as "
        "gone: the others then stop, with a line naming it (vit_jax.runtime.liveness).",
      ),
    )
    return cls(**{k: spec.define(k, values) for k, spec in specs.items()})

  def connect(self, name: str = "vit_jax") -> None:
    """Connects this process to the others of its run and watches them (vit_jax.runtime.
    liveness, whose lines start with `name`); nothing for a single process."""
    timeout = self.lost_process_timeout.value
    if distributed.initialize(
      self.mode.value, self.coordinator_address.value, self.num_processes.value,
      self.process_id.value, timeout,
    ):  # fmt: skip
      import jax
      from jax._src import distributed as jax_distributed  # the client multihost_utils uses

      from vit_jax.runtime import liveness

      state = jax_distributed.global_state
      liveness.start(
        state.client,
        jax.process_index(),
        jax.process_count(),
        timeout,
        name,
        coordinator=state.coordinator_address,
      )


def flag_value(argv: Sequence[str], name: str) -> str | None:
  """The value of `--name=value` or `--name value` in `argv`, before flags are parsed."""
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _flag_error(error: BaseException) -> tuple[BaseException, str]:
  """The exception to name and its one line, for a bad --config (or another flag)."""
  chain = []
  while error is not None and len(chain) < 10:
    chain.append(error)
    error = error.__cause__ or error.__context__
  # The outermost message without a traceback in it: absl's "flag --x=v: ..." where that is
  # one line, the config file's own exception where absl wraps a traceback around it.
  clean = [e for e in chain if "Traceback" not in str(e) and str(e).strip()]
  named = clean[0] if clean else chain[0]
  from vit_jax.runtime import console

  return named, console.first_line(named)


def _setup_console(workdir: str | None, process: int, name: str) -> str:
  """The log file (vit_jax.runtime.console) in the workdir, or in the temporary directory when the
  workdir cannot be written; exits (after setting up the latter) for an unwritable workdir."""
  from vit_jax.runtime import console

  try:
    return console.setup(workdir, process)
  except OSError as e:
    log = console.setup(None, process)
    message = f"cannot write to --workdir={workdir}: {e.strerror or e}"
    console.fail(e, log, message=message, name=name)
    sys.exit(1)


def _parser(name: str) -> Callable[[list[str]], list[str]]:
  def parse(argv: list[str]) -> list[str]:
    """absl's flag parsing, ending a bad flag or --config in one line (the traceback in the
    log file of a command that has a --workdir)."""
    try:
      return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - flags.Error, or the config file's own exception
      from vit_jax.runtime import console

      workdir = flag_value(argv, "workdir") if "workdir" in flags.FLAGS else None
      process = int(flag_value(argv, "process_id") or 0)
      named, line = _flag_error(e)
      if workdir:  # the traceback into the run's log file
        log = _setup_console(workdir, process, name)
        console.fail(e, log, message=line, kind=type(named).__name__, name=name)
      else:
        console.end(console.error_line(e, name, line, type(named).__name__))
      sys.exit(1)

  return parse


def run(
  main: Callable[[list[str], Any], Any],
  name: str,
  define_flags: Callable[..., Any],
  errors: tuple[type[BaseException], ...] = (),
) -> None:
  """Defines the command's flags, then runs `main(argv, define_flags())` as absl's app.run does.

  A bad flag, a misuse (absl's UsageError) or an exception of `errors` from `main` ends in one
  line, `<name>: error: [<Kind>: ]<message>` (exit 1). A second stop signal during a run ends
  the process at once (vit_jax.runtime.stopping), and it ends as soon as `main` is done, with its
  exit status (`end_process`)."""
  from vit_jax.runtime import stopping

  stopping.exit_on_second_signal()
  holders = define_flags()

  def guarded(argv):
    from vit_jax.runtime import console

    try:
      main(argv, holders)  # what it returns (an experiment's results) is no exit status
    except app.UsageError as e:  # one line, not absl's usage text above it
      console.end(console.error_line(e, name, kind="usage"))
      sys.exit(1)
    except errors as e:
      console.end(console.error_line(e, name))  # a command without a log file: no traceback
      sys.exit(1)

  try:
    app.run(guarded, flags_parser=_parser(name))
  except SystemExit as e:  # how app.run ends, with main's status
    end_process(_exit_status(e.code))
  except Exception:  # noqa: BLE001 - reported as the interpreter would, then the same end
    sys.excepthook(*sys.exc_info())
    end_process(1)


def _exit_status(code: Any) -> int:
  """The status `sys.exit(code)` ends a process with (a message is printed, status 1)."""
  if code is None or isinstance(code, int):
    return int(code or 0)
  print(code, file=sys.stderr)
  return 1


def end_process(status: int) -> NoReturn:
  """Ends the command's process with `status` as the interpreter's exit does, less the wait
  for the release of tf.data iterators and every destructor (os._exit), so that it ends within
  moments of its last line (docs/process.md, "A command ends at its last line")."""
  threading._shutdown()  # noqa: SLF001 - the interpreter's own first step of an exit
  pipeline = sys.modules.get("vit_jax.input_pipeline.pipeline")  # not imported: TensorFlow
  if pipeline is not None:
    atexit.unregister(pipeline.wait_for_releases)
  atexit._run_exitfuncs()  # noqa: SLF001 - the interpreter's second step
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, AttributeError):  # closed, or replaced by None
      pass
  _flush_c_streams()
  os._exit(status)


def _flush_c_streams() -> None:
  """Flushes the C library's buffered streams (a native library's printf), which exit(3)
  would flush and os._exit does not."""
  try:
    import ctypes

    ctypes.CDLL(None).fflush(None)
  except (OSError, AttributeError):  # no C library to load by that name
    pass


def call(command: types.ModuleType, argv: Sequence[str] = ()) -> Any:
  """Runs the command module's `main` in this process as `python -m <module> ARGV` would run it
  (without setting the process up), its flags defined and parsed in a FlagValues of their own,
  so that commands run, and run again, in one process; returns what `main` returns. A bad flag
  raises absl's flags.Error."""
  flag_values = flags.FlagValues()
  holders = command.define_flags(flag_values)
  return command.main(flag_values([command.__name__, *argv]), holders)


def values(holders: Any) -> types.SimpleNamespace:
  """The values of a command's flag holders (as `define_flags` returns them), by name."""
  return types.SimpleNamespace(**{k: h.value for k, h in vars(holders).items()})


def given(holders: Any) -> list[str]:
  """The flags of a command's holders that its command line set, as `--name=value` arguments
  (to start the same command again, or to print how to)."""
  return [h.serialize() for h in vars(holders).values() if h.present]


# How long a failed run's interpreter may wait for library threads before it is ended anyway.
EXIT_GRACE_S = 30.0


def run_stages(
  body: Callable[[], Any],
  workdir: str,
  distributed_flags: DistributedFlags,
  *,
  name: str = "vit_jax",
  verbose: bool = False,
) -> Any:
  """The body of a command that runs stages into `workdir`: the terminal shows progress and
  results, everything else goes to the log file (vit_jax.runtime.console; `verbose`: everything on the
  terminal); the processes of a multi-host run are connected; `body()` runs. A stop (SIGTERM,
  SIGINT, a TPU preemption: vit_jax.runtime.stopping.Stopped) ends in its line and exit status, any
  other failure in one line naming the log (exit 1)."""
  from vit_jax.runtime import console, liveness, stopping
  from vit_jax.runtime import process as process_lib

  process = distributed_flags.process_id.value or 0
  log = None if verbose else _setup_console(workdir, process, name)
  settings = process_lib.configured() or "not configured: glibc's and XLA's defaults"
  logging.info("process settings: %s", settings, extra={"terminal": False})
  try:
    distributed_flags.connect(name)
    result = body()
    liveness.finish()
    return result
  except stopping.Stopped as e:
    liveness.finish()
    console.end(f"{name}: {e}")
    sys.exit(e.exit_status)
  except Exception as e:  # noqa: BLE001 - every failure ends with one line, details in the log
    liveness.settle()  # a lost process ends this one here, naming it
    console.fail(e, log, name=name)
    liveness.finish(failed=True)
    _exit_even_if_threads_hang(1)
    sys.exit(1)


def _exit_even_if_threads_hang(status: int, grace_s: float = EXIT_GRACE_S) -> None:
  """Ends the process with `status` `grace_s` seconds from now unless it has ended by then: a
  library's worker thread left waiting after a failure must not keep a failed run alive, unseen
  by its scheduler (docs/process.md, "A failed command ends")."""

  def end():
    time.sleep(grace_s)
    os._exit(status)

  threading.Thread(target=end, name="exit_watchdog", daemon=True).start()
