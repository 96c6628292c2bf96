"""Peak FLOP/s and HBM per device: the one table the trainer, the planner and the benchmarks use.

Accelerators by `jax.Device.device_kind` prefix. TPUs: the Cloud TPU system architecture pages
(cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e, /v5p, /v6e): bf16 per chip v2 45, v3 123, v4
275, v5e 197, v5p 459, v6e 918 TFLOP/s; v2 and v3 chips are two devices (one per TensorCore),
v4 and v5p run as one "megacore" device per chip, v5e and v6e have one core. float32 on a TPU
runs at the bf16 rate (default precision: one bf16 pass). NVIDIA: the data sheets' dense
figures, bf16 and TF32 (the rate of float32 matmuls under jax's default precision); the H100
and H200 rows are the SXM parts (PCIe cards are ~25% lower).

CPUs have no table: `cpu_peak` estimates the float32 peak from /proc/cpuinfo (cores this
process may use x 2 FMA pipes x vector lanes x 2 x clock).

This file must not import TensorFlow.
"""

import dataclasses
import os
import platform

import jax

# device_kind prefix: (bf16 FLOP/s, float32 FLOP/s) per device.
PEAK_FLOPS = {
  "TPU v2": (45e12 / 2, 45e12 / 2),
  "TPU v3": (123e12 / 2, 123e12 / 2),
  "TPU v4": (275e12, 275e12),
  "TPU v5 lite": (197e12, 197e12),  # v5e
  "TPU v5e": (197e12, 197e12),
  "TPU v5p": (459e12, 459e12),
  "TPU v5": (459e12, 459e12),  # v5p reports "TPU v5"
  "TPU v6 lite": (918e12, 918e12),  # v6e (Trillium)
  "TPU v6e": (918e12, 918e12),
  "NVIDIA A100": (312e12, 156e12),
  "NVIDIA H100": (989e12, 494.5e12),
  "NVIDIA H200": (989e12, 494.5e12),
  "NVIDIA B200": (2250e12, 1100e12),
}

# HBM per device, same sources: per chip v2 16 GiB, v3 32 GiB (two devices each), v4 32 GiB,
# v5e 16 GB, v5p 95 GB, v6e 32 GB (counted here as GiB, as the runtime reports them); GPUs:
# vendor data sheets (GB).
HBM_BYTES = {
  "TPU v2": 8 * 2**30,
  "TPU v3": 16 * 2**30,
  "TPU v4": 32 * 2**30,
  "TPU v5 lite": 16 * 2**30,
  "TPU v5e": 16 * 2**30,
  "TPU v5p": 95 * 2**30,
  "TPU v5": 95 * 2**30,
  "TPU v6 lite": 32 * 2**30,
  "TPU v6e": 32 * 2**30,
  "NVIDIA A100": 80e9,
  "NVIDIA H100": 80e9,
  "NVIDIA H200": 141e9,
  "NVIDIA B200": 180e9,
}


def _row(table: dict, device_kind: str) -> str | None:
  """The key of `table` that is the longest prefix of `device_kind` (None if none)."""
  return next((p for p in sorted(table, key=len, reverse=True) if device_kind.startswith(p)), None)


def _by_kind(table: dict, device_kind: str):
  """The entry of the longest prefix of `device_kind` (None if none)."""
  row = _row(table, device_kind)
  return None if row is None else table[row]


def peak_flops(device_kind: str, dtype: str = "bfloat16") -> float | None:
  """Dense peak FLOP/s of one device of `device_kind` computing matmuls in `dtype`."""
  peaks = _by_kind(PEAK_FLOPS, device_kind)
  if peaks is None:
    return None
  return peaks[1] if str(dtype) == "float32" else peaks[0]


def peak_flops_per_device(
  device: jax.Device | None = None, dtype: str = "bfloat16"
) -> float | None:
  """`peak_flops` of `device` (default: the first device); None for CPUs and unknown kinds."""
  return peak_flops((device or jax.devices()[0]).device_kind, dtype)


def hbm_bytes_per_device(device: jax.Device | None = None) -> int | None:
  """HBM of `device` (default: the first device) in bytes; None for CPUs and unknown kinds."""
  hbm = _by_kind(HBM_BYTES, (device or jax.devices()[0]).device_kind)
  return None if hbm is None else int(hbm)


# ---------------------------------------------------------------------------------------------
# CPUs: an estimate from /proc/cpuinfo.

# The /proc/cpuinfo flags that decide how fast XLA:CPU's matmuls can be, as Linux names them.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclasses.dataclass
class CpuInfo:
  """What /proc/cpuinfo says of this machine's CPUs (of the first one listed, for the model)."""

  model: str | None
  flags: frozenset[str]
  mhz: list[float]  # every core's current clock

  def describe(self) -> str:
    """'AMD EPYC 7B13; avx2 fma, no avx512f avx512_bf16 amx_bf16 amx_tile'."""
    has = [f for f in CPU_FEATURES if f in self.flags]
    lacks = [f for f in CPU_FEATURES if f not in self.flags]
    features = " ".join(has) or "none of " + " ".join(CPU_FEATURES)
    if has and lacks:
      features += ", no " + " ".join(lacks)
    return f"{self.model or 'unknown model'}; {features}"


def parse_cpuinfo(text: str) -> CpuInfo:
  """The model name, flags and clocks of a /proc/cpuinfo text (x86: 'model name', 'flags')."""
  model, cpu_flags, mhz = None, set(), []
  for line in text.splitlines():
    key, sep, value = line.partition(":")
    if not sep:
      continue
    key, value = key.strip(), value.strip()
    if key == "model name" and model is None:
      model = value
    elif key == "flags":
      cpu_flags.update(value.split())
    elif key == "cpu MHz":
      mhz.append(float(value))
  return CpuInfo(model, frozenset(cpu_flags), mhz)


def read_cpuinfo(path: str = "/proc/cpuinfo") -> CpuInfo | None:
  """parse_cpuinfo of `path`; None where it cannot be read (not Linux, a sandbox)."""
  try:
    with open(path) as f:
      return parse_cpuinfo(f.read())
  except OSError:
    return None


def cpu_description(info: CpuInfo | None) -> str:
  """One line naming the CPU and its matmul features, for the header beside the figures."""
  if info is None:
    machine = platform.processor() or platform.machine() or "unknown"
    return f"{machine} (/proc/cpuinfo unreadable: model and features unknown)"
  return info.describe()


def cpu_peak(info: "CpuInfo | None" = None) -> tuple[float | None, str]:
  """Estimates the fp32 peak of the CPUs this process may use from /proc/cpuinfo."""
  info = read_cpuinfo() if info is None else info
  if info is None:
    return None, "unknown (no /proc/cpuinfo)"
  if not info.mhz:
    return None, "unknown (no clock in /proc/cpuinfo)"
  if "avx512f" in info.flags:
    lanes = 16
  elif "avx2" in info.flags and "fma" in info.flags:
    lanes = 8
  else:
    return None, "unknown (no AVX2+FMA)"
  cores = len(os.sched_getaffinity(0))
  ghz = max(info.mhz) / 1e3
  # Two FMA pipes per core on every AVX2/AVX-512 server core of the last decade (Haswell+, Zen).
  peak = cores * 2 * lanes * 2 * ghz * 1e9
  isa = "AVX-512" if lanes == 16 else "AVX2"
  return peak, f"estimate: {cores} cores x 2 FMA x {lanes} fp32 lanes ({isa}) x 2 x {ghz:.2f} GHz"


def device_peak(
  platform_name: str, device_kind: str, dtype: str, peak_tflops: float | None = None
) -> tuple[float | None, str]:
  """(peak FLOP/s or None, how it was obtained) of a device computing in `dtype`;
  `peak_tflops` (a user's figure, in TFLOP/s) overrides it."""
  if peak_tflops:
    return peak_tflops * 1e12, "given"
  if platform_name == "cpu":
    peak, how = cpu_peak()
    # bf16 trains slower than float32 under XLA:CPU even on a CPU with AVX512-BF16 and AMX
    # (docs/benchmarks.md), so the float32 peak is the bound.
    return peak, how + ("; bf16 bound by the fp32 peak" if dtype != "float32" else "")
  peak = peak_flops(device_kind, dtype)
  if peak is None:
    return None, f"unknown device kind {device_kind!r}"
  return peak, "table: " + _row(PEAK_FLOPS, device_kind)
