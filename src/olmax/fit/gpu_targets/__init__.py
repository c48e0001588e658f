"""XLA's target descriptions of the GPUs olmax compiles for without one (olmax.fit.chips, Chip.gpu_target;
olmax.fit.compile_check): package data, one text-format GpuTargetConfigProto per GPU, each citing its source."""
