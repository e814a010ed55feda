"""The AOT runtime: variant choice, artifact sets, and the driver-API loader."""
from .errors import LaunchError, LigerAOTError, MissingVariantError
from .kernel import TORCH_TO_TRITON, Kernel

__all__ = ["Kernel", "LaunchError", "LigerAOTError", "MissingVariantError", "TORCH_TO_TRITON"]
