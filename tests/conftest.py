"""Test setup: eight simulated CPU devices, so sharding code runs as on a pod slice.

The device count is forced whatever XLA_FLAGS the environment already holds (a user's own flags
are kept, a device count of theirs is replaced): the mesh tests need eight devices.
"""

import os
import re

# Must happen before jax is imported anywhere in the test process.
_DEVICES = "--xla_force_host_platform_device_count=8"
_others = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = " ".join([*_others.split(), _DEVICES])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
