"""Test setup: eight simulated CPU devices, so sharding code runs as on a pod slice."""

import os

# Must happen before jax is imported anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
