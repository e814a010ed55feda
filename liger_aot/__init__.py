"""liger-aot: Liger-style Triton kernels for LLM training, compiled ahead of time."""
__version__ = "0.1.0"
