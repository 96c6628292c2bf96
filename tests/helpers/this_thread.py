"""A stand-in for a process-wide function seen by the test's own thread only.

A test that patches a function every thread of the worker can call (`time.perf_counter`,
`socket.gethostname`, `tf.compat.v1.io.tf_record_iterator`, `jax.process_count`) must not feed its
fake to the threads of another test still running in the same worker (a tf.data reader not yet
released, an Orbax commit, a lease's renewal): they would consume the fake's values or be counted
as the test's calls. `only(fake, real)` answers `fake` on the thread that made it, `real` on any
other.
"""

import threading
from collections.abc import Callable
from typing import Any


def only(fake: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
  """`fake` on the calling thread (the test's), `real` on every other thread."""
  owner = threading.get_ident()

  def dispatch(*args, **kwargs):
    return (fake if threading.get_ident() == owner else real)(*args, **kwargs)

  return dispatch
