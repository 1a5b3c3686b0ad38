"""hf2triton: release Hugging Face models to NVIDIA Triton Inference Server."""

__version__ = "0.1.0"
