"""The ops' torch.compile custom ops are defined lazily (liger_aot/ops/_custom_ops.py): not
at import when Dynamo is loaded, at the first compile, at import when it is not, and at the
first call after a torch._dynamo.reset() that came before any compile. Each case runs in a
fresh interpreter: what is defined depends on the import order."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# rms_norm eagerly and compiled; prints whether the custom ops were defined before / after.
COMPILE_RMS_NORM = """
    from liger_aot.ops import rms_norm as m
    before = m.rms_norm_fwd_op._op is not None, hasattr(torch.ops.liger_aot, "rms_norm_fwd")
    fn = lambda x, w: m.rms_norm(x, w, 1e-6)
    x, w = torch.randn(3, 40), torch.randn(40)
    out = []
    for f in (fn, torch.compile(fn, fullgraph=FULLGRAPH, backend="aot_eager")):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = f(xr, wr)
        y.sum().backward()
        out.append((y.detach(), xr.grad, wr.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    import torch._dynamo.utils
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print("before", before, "after", m.rms_norm_fwd_op._op is not None,
          hasattr(torch.ops.liger_aot, "rms_norm_fwd"), "breaks", breaks)
"""


def run(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


def test_defined_at_first_compile_when_dynamo_is_loaded():
    # rope imported before the compile, swiglu after it: both defined once it started
    out = run("import torch, torch._dynamo\nFULLGRAPH = True\n"
              "from liger_aot.ops import rope\n"
              "print_ = print\nprint = lambda *a: print_(*a, end=' ')\n"
              + textwrap.dedent(COMPILE_RMS_NORM) + textwrap.dedent("""
        from liger_aot.ops import swiglu
        print_(rope.rope_fwd_op._op is not None, swiglu.glu_fwd_op._op is not None)
    """))
    assert out == "before (False, False) after True True breaks 0 True True"


def test_defined_at_import_without_dynamo():
    out = run("""
        import sys, torch
        from liger_aot.ops import rms_norm as m
        print(m.rms_norm_fwd_op._op is not None, "torch._dynamo" in sys.modules)
    """)
    assert out == "True False"


def test_reset_before_first_compile_costs_one_graph_break():
    # reset() drops the compile-start callback: the op is defined at its first (traced) call
    out = run("import torch, torch._dynamo\nFULLGRAPH = False\n"
              "from liger_aot.ops import rms_norm\ntorch._dynamo.reset()\n"
              + textwrap.dedent(COMPILE_RMS_NORM))
    before, after = out.split(" after ")
    assert before == "before (False, False)"
    assert after.startswith("True True breaks ") and int(after.split()[-1]) >= 1


def test_define_all_before_compile_after_reset():
    out = run("import torch, torch._dynamo\nFULLGRAPH = True\n"
              "import liger_aot.ops\nfrom liger_aot.ops import rms_norm\n"
              "torch._dynamo.reset()\nliger_aot.ops.define_custom_ops()\n"
              + textwrap.dedent(COMPILE_RMS_NORM))
    assert out == "before (True, True) after True True breaks 0"


def test_fake_and_autograd_registered_before_and_after_definition(monkeypatch):
    from liger_aot.ops import _custom_ops
    from liger_aot.ops._custom_ops import LazyCustomOp

    def fwd(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    def backward(ctx, dy):
        return dy * 3

    for i, define_first in enumerate((True, False)):
        # not defined at declaration whatever this process imported first
        monkeypatch.setattr(_custom_ops, "_define_at_declaration", False)
        op = LazyCustomOp(f"liger_aot_test::triple{i}", fwd)
        assert "defined=False" in repr(op)
        if define_first:
            op.custom_op  # noqa: B018 - defines it
        op.register_fake(lambda x: torch.empty_like(x))
        op.register_autograd(backward, setup_context=lambda ctx, inputs, output: None)
        x = torch.randn(5, requires_grad=True)
        op(x).sum().backward()
        assert torch.equal(x.grad, torch.full((5,), 3.0))
        torch.library.opcheck(op.custom_op, (torch.randn(4, requires_grad=True),))
        assert "defined=True" in repr(op)


@pytest.mark.parametrize("name", ["rms_norm_fwd_op", "fused_add_rms_norm_bwd_op"])
def test_op_modules_declare_lazy_ops(name):
    from liger_aot.ops import rms_norm
    from liger_aot.ops._custom_ops import LazyCustomOp

    assert isinstance(getattr(rms_norm, name), LazyCustomOp)


def test_export_defines_the_op_without_dynamo_compiling():
    # non-strict torch.export traces without Dynamo, so no compile-start callback runs: the
    # op is defined at its first call, outside any Dynamo trace, and lands in the graph
    out = run("""
        import torch, torch._dynamo
        from liger_aot.ops import rms_norm as m
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(40))
            def forward(self, x):
                return m.rms_norm(x, self.w, 1e-6)
        before = m.rms_norm_fwd_op._op is not None
        ep = torch.export.export(M(), (torch.randn(3, 40),), strict=False)
        print(before, m.rms_norm_fwd_op._op is not None, "liger_aot.rms_norm_fwd" in str(ep.graph))
    """)
    assert out == "False True True"
