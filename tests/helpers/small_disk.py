"""A small disk for tests, as any user: a tmpfs mounted in a private user and mount namespace.

Mounting a filesystem needs root, but an unprivileged user may create a user namespace in which
it is root and mount a tmpfs there (Linux's unprivileged user namespaces, on by default in
Debian and Ubuntu). The mount is visible only inside that namespace, so a holder process keeps
the namespace alive; commands run inside it through `nsenter` (`SmallDisk.prefix`), and the test
process reads and writes the disk through the holder's root (`SmallDisk.view`, a path under
/proc/<pid>/root). Nothing is mounted on the machine itself: when the holder ends, the disk and
everything on it are gone.
"""

import contextlib
import dataclasses
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class SmallDisk:
  path: pathlib.Path  # the mount point, as the commands of `prefix` see it
  view: pathlib.Path  # the same directory, as this process sees it
  holder_pid: int

  def prefix(self, cwd: str | os.PathLike) -> list[str]:
    """Runs a command inside the namespace, in `cwd`: [*disk.prefix(cwd), "python", ...]."""
    return [
      "nsenter", f"--target={self.holder_pid}", "--user", "--mount", "--preserve-credentials",
      f"--wd={cwd}",
    ]  # fmt: skip

  def free_bytes(self) -> int:
    stats = os.statvfs(self.view)
    return stats.f_bavail * stats.f_frsize


def unavailable_reason() -> str | None:
  """None if this machine lets this user create a small disk; otherwise why not."""
  for tool in ("unshare", "nsenter"):
    if shutil.which(tool) is None:
      return f"{tool} (util-linux) is not installed"
  probe = subprocess.run(
    ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True, text=True
  )
  if probe.returncode != 0:
    return f"no user namespace for this user: {probe.stderr.strip()}"
  return None


@contextlib.contextmanager
def small_disk(path: pathlib.Path, size: str) -> Iterator[SmallDisk]:
  """A tmpfs of `size` ('8m') at `path` (created if needed) for the block's duration."""
  path.mkdir(parents=True, exist_ok=True)
  holder = subprocess.Popen(
    [
      "unshare", "--user", "--map-root-user", "--mount",
      "sh", "-c", 'mount -t tmpfs -o size="$1" tmpfs "$2" && echo ready && exec sleep 3600',
      "sh", size, str(path),
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )  # fmt: skip
  try:
    if holder.stdout.readline().strip() != "ready":
      raise RuntimeError(f"could not mount a tmpfs in a user namespace: {holder.stderr.read()}")
    yield SmallDisk(
      path=path,
      view=pathlib.Path(f"/proc/{holder.pid}/root") / path.relative_to(path.anchor),
      holder_pid=holder.pid,
    )
  finally:
    holder.kill()
    holder.wait()
