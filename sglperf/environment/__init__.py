"""What the numbers depend on outside the code under test: the host's other load, the GPUs (one NVML/nvidia-smi
reader: inventory, telemetry, faults) and the fingerprint."""
