"""Test setup. CPU tests run kernels through Triton's interpreter, which must be chosen
before triton is imported. GPU tests (marker `gpu`) run with `pytest -m gpu`."""
import os

if os.environ.get("LIGER_AOT_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
