"""hf2triton: release Hugging Face models to NVIDIA Triton Inference Server."""

__version__ = "0.1.0"

from hf2triton.serving import openvino_telemetry_off

openvino_telemetry_off()  # before anything of hf2triton imports openvino or NNCF
