"""What a step costs: device peaks, model FLOPs, and the compiled step's memory and FLOPs.

  devices         peak FLOP/s and HBM per device (one table: the trainer's MFU, the planner
                  and the benchmarks read it), and the CPU's estimated peak from /proc/cpuinfo
  flops           model FLOPs per example, counted from the model's matmuls and convolutions
                  (whichever attention or LayerNorm kernel runs), and XLA's count of a
                  compiled function
  compiled_stats  the compiled step's memory, FLOPs and collectives per device (HLO parsing)

This package must not import TensorFlow.
"""
