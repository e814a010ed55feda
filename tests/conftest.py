"""Test setup. CPU tests run kernels through Triton's interpreter, which must be chosen
before triton is imported. GPU tests (marker `gpu`, run with `pytest -m gpu`) use the AOT
path, which never imports triton, so the setting does not touch them."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
