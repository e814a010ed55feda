"""GPU tests: `pytest -m gpu` on a machine with an NVIDIA (sm80/sm90) GPU.

Artifacts come from LIGER_AOT_ARTIFACT_DIR when set, else the device's arch is built into a
temporary directory first (conftest.py: gpu_artifact_dir).
"""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def test_zero_jit_fresh_process(gpu_artifact_dir, tmp_path):
    """Fresh process, empty TRITON_CACHE_DIR, no C compiler, `import triton` blocked, strict
    mode: every op forward and backward at three shapes (one non-power-of-two hidden size, one
    misaligned storage offset), fp32 and bf16, matches float64 PyTorch; afterwards triton is
    not in sys.modules and the cache directory was never created."""
    cache = tmp_path / "triton-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    env.update(TRITON_CACHE_DIR=str(cache), CC=str(tmp_path / "no-such-compiler"),
               LIGER_AOT_STRICT="1", LIGER_AOT_ARTIFACT_DIR=gpu_artifact_dir,
               LIGER_AOT_IGNORE_CACHE="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "gpu_zero_jit_child.py")],
                          env=env, cwd=str(tmp_path), capture_output=True, text=True)
    print(proc.stdout)
    print(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "zero-JIT run passed" in proc.stdout
    assert not cache.exists()
