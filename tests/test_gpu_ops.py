"""Every op at realistic shapes on a GPU against PyTorch (`pytest -m gpu`), CUDA-graph capture
of a training step's ops, and torch.compile(fullgraph=True) over them.

References run in float32 on the GPU (float64 where cheap); bf16 outputs must be within 2e-2
relative error, fp32 within 1e-4.
"""
import pytest
import torch
import torch.nn.functional as F

from _op_helpers import deterministic_mode

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _need_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    torch.manual_seed(0)


def rel(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def tol(dtype):
    return 2e-2 if dtype == torch.bfloat16 else 1e-4


def grads_of(fn, *inputs, grad=None):
    """(output, grads) of fn at leaf copies of inputs, backpropagating `grad` (or a fixed
    random tensor) from the output."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    if grad is None:
        g = torch.Generator(device=DEV).manual_seed(7)
        grad = torch.randn(out.shape, device=DEV, generator=g, dtype=out.dtype)
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves if t.grad is not None], grad


def check(ours, ref, *inputs, dtype, scalar=False):
    out, grads, g = grads_of(ours, *inputs)
    ref_out, ref_grads, _ = grads_of(lambda *xs: ref(*[x.double() for x in xs]),
                                     *inputs, grad=g.double())
    errors = [rel(out, ref_out)] + [rel(a, b) for a, b in zip(grads, ref_grads)]
    assert len(grads) == len(ref_grads)
    assert all(e < tol(dtype) for e in errors), errors
    return errors


DTYPES = [torch.float32, torch.bfloat16]


# hidden sizes: whole-row backwards up to 8K columns, grouped ones over it (12288, 16384,
# 65536; sm90), looped ones where grouped cannot (20000: not a multiple of its slice)
@pytest.mark.parametrize("hidden", [2880, 4096, 5120, 8192, 12288, 16384, 20000, 65536])
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms(hidden, dtype):
    from liger_aot.ops.layer_norm import layer_norm
    from liger_aot.ops.rms_norm import fused_add_rms_norm, rms_norm

    rows = 1024 if hidden <= 8192 else 300
    x = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    r = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    w = torch.randn(hidden, device=DEV, dtype=dtype)
    b = torch.randn(hidden, device=DEV, dtype=dtype)

    def rms_ref(s, w):
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    check(lambda x, w: rms_norm(x, w, 1e-6, in_place=False), rms_ref, x, w, dtype=dtype)
    # in place (Liger-Kernel's module default) may overwrite the gradient handed to the
    # backward (not with the interleaved layout of rows over 16K): the reference goes first
    g = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    _, want, _ = grads_of(lambda x, w: rms_ref(x.double(), w.double()), x, w, grad=g.double())
    _, got, _ = grads_of(lambda x, w: rms_norm(x, w, 1e-6, in_place=True), x, w, grad=g)
    assert all(rel(a, b) < tol(dtype) for a, b in zip(got, want))
    check(lambda x, w, b: layer_norm(x, w, b, 1e-6),
          lambda x, w, b: F.layer_norm(x, (hidden,), w, b, 1e-6), x, w, b, dtype=dtype)
    # both outputs used, so the residual's gradient (dres) flows through the backward
    check(lambda x, r, w: sum(fused_add_rms_norm(x, r, w, 1e-6)),
          lambda x, r, w: rms_ref(x + r, w) + (x + r), x, r, w, dtype=dtype)


# 1K-8K: the table's whole-row and exact-length looped configs; 20000: looped; 65536: grouped
@pytest.mark.parametrize("hidden", [1024, 2048, 4096, 8192, 20000, 65536])
@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_forwards_without_a_backward(monkeypatch, hidden, dtype):
    """Under torch.no_grad the norm ops launch with store_stats 0: the same outputs, bit for
    bit, as in grad mode (same kernel, same config), and the statistics' placeholder (sized
    for every row, so a kernel that wrote anyway would show) left alone. The grouped forward
    (65536) writes its statistics either way, into buffers of its own."""
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod
    from liger_aot.ops.layer_norm import layer_norm
    from liger_aot.ops.rms_norm import fused_add_rms_norm, rms_norm

    rows = 300
    placeholder = torch.full((2 * rows,), -123.0, device=DEV)
    for mod in (ln_mod, rms_mod):
        monkeypatch.setattr(mod, "unused_stats", lambda device: placeholder)
    x = torch.randn(rows, hidden, device=DEV, dtype=dtype) + 1
    r = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    w = torch.randn(hidden, device=DEV, dtype=dtype).requires_grad_()
    b = torch.randn(hidden, device=DEV, dtype=dtype)
    calls = (lambda: (rms_norm(x, w, 1e-6),), lambda: (layer_norm(x, w, b, 1e-6),),
             lambda: (layer_norm(x, w, None, 1e-6),),
             lambda: fused_add_rms_norm(x, r, w, 1e-6))
    for call in calls:
        with torch.no_grad():
            got = call()
        want = call()  # w requires grad: a backward may follow
        assert all(torch.equal(a, c.detach()) for a, c in zip(got, want))
    assert (placeholder == -123.0).all(), "a forward wrote its statistics anyway"


def _table_staged(name):
    """{bucket: config} of the staged configs the sm90 table chose for a norm forward."""
    from liger_aot.kernel_src import tuning
    from liger_aot.kernel_src.spec import is_staged
    from liger_aot.kernel_src.layer_norm import spec as ln_spec
    from liger_aot.kernel_src.rms_norm import spec as rms_spec

    spec = {"rms_norm_fwd": rms_spec.FWD, "layer_norm_fwd": ln_spec.FWD}[name]
    return {int(key.split(",")[0].split("=")[1]): config
            for key, config in tuning.tuned_configs(spec, "sm90").items() if is_staged(config)}


# Empty since session 18, whose tune chose the looped forwards' whole-row pass 1 over the
# staged configs (the test then skips); a table that picks staged configs again brings their
# cases back (the tuner checks each candidate against torch on the GPU before timing it).
STAGED_CASES = [(name, bucket, n) for name in ("rms_norm_fwd", "layer_norm_fwd")
                for bucket in sorted(_table_staged(name)) for n in (bucket, bucket * 5 // 8)]


# each bucket's full row and a row of 5/8 of it (partial chunks: masked copies and stores)
@pytest.mark.parametrize("name,bucket,hidden", STAGED_CASES,
                         ids=[f"{name}-{n}" for name, _, n in STAGED_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_staged_norm_forwards(monkeypatch, name, bucket, hidden, dtype):
    """The sm90 table's staged forwards (Gluon, kernel_src/staged_rows.py) through the ops
    against float64: RMSNorm in its three casting modes, LayerNorm with and without bias.
    300 rows over one program an SM: programs take 2 or 3 rows, and the ring's last copies
    lie past n_rows. (The tuner checked every staged candidate in bf16 before timing it.)
    The grouped forwards, which take most of these rows, are switched off."""
    from liger_aot.kernel_src import tuning
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod

    mod = rms_mod if name == "rms_norm_fwd" else ln_mod
    monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_FWD", "0")
    monkeypatch.setattr(mod, "_grouped_fwd_devices", {})
    launches = _record_launches(monkeypatch, mod._fwd)
    assert mod._fwd.select_config(0, hidden, dtype=dtype) is _table_staged(name)[bucket]
    _norm_forward_matches_float64(mod, hidden, dtype)
    assert tuning.bucket_key(mod._fwd.spec, (hidden,)).startswith(f"n_cols={bucket}")
    assert launches  # the staged kernel's op, not the grouped one


def _norm_forward_matches_float64(mod, hidden, dtype, rows=300):
    """The module's forward (RMSNorm in its three casting modes, LayerNorm with and without
    bias) against float64."""
    from liger_aot.ops import rms_norm as rms_mod
    from liger_aot.ops import layer_norm as ln_mod

    limit = 2e-2 if dtype == torch.bfloat16 else 2e-3
    eps = 1e-6
    x = torch.randn(rows, hidden, device=DEV, dtype=dtype) * 2 + 0.5
    w = (torch.rand(hidden, device=DEV) + 0.5).to(dtype)
    b = torch.randn(hidden, device=DEV).to(dtype)
    x64 = x.double()
    if mod is rms_mod:
        rstd_ref = torch.rsqrt(x64.pow(2).mean(-1) + eps)
        for casting, offset in ((0, 0.0), (1, 1.0), (2, 0.0)):
            y, _, rstd = rms_mod._forward(x, w, eps, offset, casting, None)
            y_ref = x64 * rstd_ref[:, None] * (w.double() + offset)
            assert rel(rstd, rstd_ref) < 1e-5, casting
            assert rel(y, y_ref) < limit, casting
    else:
        for bias in (b, None):
            y, _, mean, rstd = ln_mod.layer_norm_forward(x, w, bias, eps)
            y_ref = F.layer_norm(x64, (hidden,), w.double(),
                                 None if bias is None else bias.double(), eps)
            assert rel(mean, x64.mean(-1)) < 1e-5
            assert rel(rstd, torch.rsqrt(x64.var(-1, unbiased=False) + eps)) < 1e-5
            assert rel(y, y_ref) < limit, bias is None


def _table_exact():
    """(spec name, bucket, config) of the exact-length configs (EXACT_KEY) the sm90 table
    chose for the norm forwards."""
    from liger_aot.kernel_src import tuning
    from liger_aot.kernel_src.spec import EXACT_KEY
    from liger_aot.kernel_src.layer_norm import spec as ln_spec
    from liger_aot.kernel_src.rms_norm import spec as rms_spec

    return [(spec.name, int(key.split(",")[0].split("=")[1]), config)
            for spec in (rms_spec.FWD, ln_spec.FWD)
            for key, config in sorted(tuning.tuned_configs(spec, "sm90").items())
            if config.constexprs.get(EXACT_KEY)]


# each exact config at its own length, and its bucket's 5/8 length (the twin's)
EXACT_CASES = [(name, bucket, n) for name, bucket, _ in _table_exact()
               for n in (bucket, bucket * 5 // 8)]


@pytest.mark.parametrize("name,bucket,hidden", EXACT_CASES,
                         ids=[f"{name}-{n}" for name, _, n in EXACT_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_exact_length_norm_forwards(monkeypatch, name, bucket, hidden, dtype):
    """The sm90 table's looped forwards with the row length compiled in (EXACT_KEY) through
    the ops against float64, and at another length of the bucket what runs there (the
    entry's inexact config, else the twin): the op runs the exact config only at its length
    (kernel_src/tuning.py, select). 301 rows: two-row programs end on a half block. The
    grouped forwards are switched off."""
    from liger_aot.kernel_src import tuning
    from liger_aot.kernel_src.spec import EXACT_KEY, inexact_twin
    from liger_aot.ops import layer_norm as ln_mod
    from liger_aot.ops import rms_norm as rms_mod

    mod = rms_mod if name == "rms_norm_fwd" else ln_mod
    monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_FWD", "0")
    monkeypatch.setattr(mod, "_grouped_fwd_devices", {})
    exact = next(c for n, b, c in _table_exact() if (n, b) == (name, bucket))
    got = mod._fwd.select_config(0, hidden, dtype=dtype)
    if hidden == bucket:
        assert got is exact
    else:  # the length's own config, else the entry's inexact config, else the twin
        key = tuning.bucket_key(mod._fwd.spec, (bucket,))
        own = tuning.length_configs(mod._fwd.spec, "sm90").get(key, {}).get(hidden)
        other = tuning.inexact_configs(mod._fwd.spec, "sm90").get(key)
        assert EXACT_KEY not in got.constexprs
        assert got.tag == (own or other or inexact_twin(exact)).tag
    launches = _record_launches(monkeypatch, mod._fwd)
    _norm_forward_matches_float64(mod, hidden, dtype, rows=301)
    assert launches


GROUPED_FWD_CASES = [  # (rows, hidden, dtype, casting, offset, residual)
    (3000, 20480, torch.bfloat16, "llama", 0.0, False),  # 10 programs a row
    (2048, 32768, torch.float16, "gemma", 1.0, False),
    (1024, 65536, torch.bfloat16, "none", 0.0, False),
    (7, 65536, torch.bfloat16, "llama", 0.0, False),  # fewer rows than groups
    (5, 18432, torch.bfloat16, "llama", 0.0, False),  # the shortest rows it takes
    (1024, 65536, torch.bfloat16, "llama", 0.0, True),
    (7, 65536, torch.float16, "gemma", 1.0, True),
    (1500, 40960, torch.bfloat16, "none", 0.0, True),
]


@pytest.mark.parametrize("rows,hidden,dtype,casting,offset,residual", GROUPED_FWD_CASES,
                         ids=[f"{r}x{h}-{str(d)[6:]}-{c}-{o}-{'res' if res else 'plain'}"
                              for r, h, d, c, o, res in GROUPED_FWD_CASES])
def test_grouped_rms_norm_forward(monkeypatch, rows, hidden, dtype, casting, offset, residual):
    """The grouped forward (kernel_src/rms_norm/kernels.py: rms_norm_fwd_grouped, rows split
    over groups of programs that exchange their sums of squares) through the op against
    float64: y, rstd and the fused add's s, every casting mode, an offset; the launch is the
    grouped one, also at the lengths the op leaves to the looped forward (plain rows up to
    32K: GROUPED_FWD_MIN_COLS lowered for the test to the kernel's shortest, 18432)."""
    from liger_aot.ops import rms_norm as rms_mod

    monkeypatch.setattr(rms_mod.spec, "GROUPED_FWD_MIN_COLS",
                        16384 + rms_mod.spec.GROUPED_BLOCK_N)
    launches = _record_launches(monkeypatch, rms_mod._fwd_grouped)
    x = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    r = torch.randn(rows, hidden, device=DEV, dtype=dtype) if residual else None
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(dtype)
    y, s, rstd = rms_mod._forward(x, w, 1e-6, offset, rms_mod._casting(casting), r)
    s_ref = (x + r) if residual else x  # rounded to the dtype, as the kernels' s
    s64 = s_ref.double()
    rstd_ref = torch.rsqrt(s64.pow(2).mean(-1) + 1e-6)
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    assert rel(rstd, rstd_ref) < 1e-5
    assert rel(y, s64 * rstd_ref[:, None] * (w.double() + offset)) < limit
    assert y.dtype == dtype
    if residual:
        assert torch.equal(s, s_ref)  # s = x + r in the dtype, as torch adds
    config = rms_mod.spec.GROUPED_FWD_RES_CONFIG if residual else rms_mod.spec.GROUPED_FWD_CONFIG
    split = hidden // config.constexprs["BLOCK_N"]
    assert len(launches) == 1 and launches[0][0] % split == 0, launches


GROUPED_CASES = [  # (rows, hidden, dtype, casting, offset, in_place)
    (4096, 16384, torch.bfloat16, "llama", 0.0, False),
    (2048, 32768, torch.float16, "gemma", 1.0, True),
    (1024, 65536, torch.bfloat16, "none", 0.0, False),
    (7, 65536, torch.bfloat16, "llama", 0.0, True),  # fewer rows than groups
    (3000, 20480, torch.bfloat16, "llama", 0.0, False),  # 10 programs a row
]


@pytest.mark.parametrize("rows,hidden,dtype,casting,offset,in_place", GROUPED_CASES,
                         ids=[f"{r}x{h}-{str(d)[6:]}-{c}-{o}-{'in' if i else 'out'}"
                              for r, h, d, c, o, i in GROUPED_CASES])
def test_grouped_rms_norm_backward(monkeypatch, rows, hidden, dtype, casting, offset,
                                   in_place):
    """The grouped backward (kernel_src/rms_norm/kernels.py: rms_norm_bwd_grouped, rows split
    over groups of programs that exchange their dot) through the op against float64: dx and
    dw, every casting mode, an offset, in place; the launch is the grouped one."""
    from liger_aot.ops import rms_norm as rms_mod

    launches = _record_launches(monkeypatch, rms_mod._bwd_grouped)
    x = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(dtype)
    g = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w64)).backward(
        g.double())
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    rms_mod.rms_norm(xl, wl, 1e-6, offset, casting, in_place=in_place).backward(g.clone())
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    assert rel(xl.grad, x64.grad) < limit and rel(wl.grad, w64.grad) < limit
    assert xl.grad.dtype == dtype and wl.grad.dtype == dtype
    split = hidden // rms_mod.spec.GROUPED_CONFIG.constexprs["BLOCK_N"]
    assert len(launches) == 1 and launches[0][0] % split == 0, launches


def _record_launches(monkeypatch, kernel, args=None):
    """The grids `kernel` (a runtime Kernel) is launched with, launching as usual; `args`, a
    list, also gets each launch's arguments by the spec's parameter names."""
    launches = []
    launch = kernel.launch
    names = [p.name for p in kernel.spec.params]

    def record(grid, *a, **k):
        launches.append(grid)
        if args is not None:
            args.append(dict(zip(names, a)))
        return launch(grid, *a, **k)
    monkeypatch.setattr(kernel, "launch", record)
    return launches


GROUPED_DRES_CASES = [  # (rows, hidden, dtype, casting, offset, in_place, one gradient)
    (4096, 16384, torch.bfloat16, "llama", 0.0, False, False),
    (1024, 65536, torch.float16, "gemma", 1.0, True, False),
    (7, 65536, torch.bfloat16, "none", 0.0, False, False),  # fewer rows than groups
    (3000, 20480, torch.bfloat16, "llama", 0.0, True, False),  # 10 programs a row
    (2048, 32768, torch.bfloat16, "llama", 0.0, True, True),  # dres is dy's buffer
]


@pytest.mark.parametrize("rows,hidden,dtype,casting,offset,in_place,same", GROUPED_DRES_CASES,
                         ids=[f"{r}x{h}-{str(d)[6:]}-{c}-{o}-{'in' if i else 'out'}"
                              + ("-same" if same else "")
                              for r, h, d, c, o, i, same in GROUPED_DRES_CASES])
def test_grouped_fused_add_rms_norm_backward(monkeypatch, rows, hidden, dtype, casting, offset,
                                             in_place, same):
    """The grouped backward with the residual gradient (rms_norm_bwd_grouped, HAS_DRES)
    through fused_add_rms_norm against float64, both outputs used (`same`: one gradient
    tensor for both, so dres is dy's buffer and dx is not written in place): dx, dres and dw;
    the launch is the grouped one."""
    from liger_aot.ops import rms_norm as rms_mod

    args = []
    launches = _record_launches(monkeypatch, rms_mod._bwd_grouped, args)
    x = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    r = torch.randn(rows, hidden, device=DEV, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(dtype)
    gy = torch.randn_like(x)
    gs = gy if same else torch.randn_like(x)
    x64, r64, w64 = (t.double().requires_grad_() for t in (x, r, w))
    s64 = x64 + r64
    y64 = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w64)
    torch.autograd.backward((y64, s64), (gy.double(), gs.double()))
    xl, rl, wl = (t.clone().requires_grad_() for t in (x, r, w))
    y, s_out = rms_mod.fused_add_rms_norm(xl, rl, wl, 1e-6, offset, casting, in_place=in_place)
    gy_op = gy.clone()
    torch.autograd.backward((y, s_out), (gy_op, gy_op if same else gs.clone()))
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    for got, want in ((xl.grad, x64.grad), (rl.grad, r64.grad), (wl.grad, w64.grad)):
        assert got.dtype == dtype and rel(got, want) < limit, rel(got, want)
    split = hidden // rms_mod.spec.GROUPED_DRES_CONFIG.constexprs["BLOCK_N"]
    assert len(launches) == 1 and launches[0][0] % split == 0, launches
    (a,) = args
    assert (a["DRES"].data_ptr() == a["DY"].data_ptr()) == same
    assert a["DX"].data_ptr() != a["DY"].data_ptr() or (in_place and not same)


GROUPED_LN_CASES = [  # (rows, hidden, dtype, bias, mean shift)
    (4096, 16384, torch.bfloat16, True, 0.0),
    (2048, 32768, torch.float16, True, 0.0),
    (1024, 65536, torch.bfloat16, False, 0.0),
    (1024, 65536, torch.bfloat16, True, 20.0),  # |mean| >> std
    (7, 65536, torch.bfloat16, True, 0.0),  # fewer rows than groups
    (3000, 20480, torch.float16, True, 0.0),  # 10 programs a row
]


@pytest.mark.parametrize("rows,hidden,dtype,bias,shift", GROUPED_LN_CASES,
                         ids=[f"{r}x{h}-{str(d)[6:]}-{'b' if b else 'nob'}-{s}"
                              for r, h, d, b, s in GROUPED_LN_CASES])
def test_grouped_layer_norm_backward(monkeypatch, rows, hidden, dtype, bias, shift):
    """The grouped LayerNorm backward (kernel_src/layer_norm/kernels.py: layer_norm_bwd_grouped,
    two shares a row in one word) through the op against float64: dx, dw and db; the launch
    is the grouped one."""
    from liger_aot.ops import layer_norm as ln_mod

    launches = _record_launches(monkeypatch, ln_mod._bwd_grouped)
    x = (torch.randn(rows, hidden, device=DEV) + shift).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(dtype)
    b = (0.1 * torch.randn(hidden, device=DEV)).to(dtype) if bias else None
    g = torch.randn_like(x)
    leaves = [t.double().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
    F.layer_norm(leaves[0], (hidden,), leaves[1], leaves[2] if bias else None,
                 1e-5).backward(g.double())
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    bl = b.clone().requires_grad_() if bias else None
    ln_mod.layer_norm(xl, wl, bl, 1e-5).backward(g.clone())
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    got = [xl.grad, wl.grad] + ([bl.grad] if bias else [])
    for out, want in zip(got, (t.grad for t in leaves)):
        assert out.dtype == dtype and rel(out, want) < limit, rel(out, want)
    split = hidden // ln_mod.spec.GROUPED_CONFIG.constexprs["BLOCK_N"]
    assert len(launches) == 1 and launches[0][0] % split == 0, launches


@pytest.mark.parametrize("rows,hidden,dtype,bias,shift", GROUPED_LN_CASES,
                         ids=[f"{r}x{h}-{str(d)[6:]}-{'b' if b else 'nob'}-{s}"
                              for r, h, d, b, s in GROUPED_LN_CASES])
def test_grouped_layer_norm_forward(monkeypatch, rows, hidden, dtype, bias, shift):
    """The grouped LayerNorm forward (kernel_src/layer_norm/kernels.py: layer_norm_fwd_grouped,
    two shifted sums a row in one word) through the op against float64: y, mean and rstd;
    the launch is the grouped one, also at the lengths the op leaves to the looped forward
    (GROUPED_FWD_LOOPED_COLS, emptied for the test)."""
    from liger_aot.ops import layer_norm as ln_mod

    monkeypatch.setattr(ln_mod.spec, "GROUPED_FWD_LOOPED_COLS", ())
    launches = _record_launches(monkeypatch, ln_mod._fwd_grouped)
    x = (torch.randn(rows, hidden, device=DEV) * 2 + shift).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEV)).to(dtype)
    b = (0.1 * torch.randn(hidden, device=DEV)).to(dtype) if bias else None
    y, _, mean, rstd = ln_mod.layer_norm_forward(x, w, b, 1e-5)
    x64 = x.double()
    y_ref = F.layer_norm(x64, (hidden,), w.double(), b.double() if bias else None, 1e-5)
    limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
    # the mean is the shift (x[row, 0]) plus the shifted sum's: within an fp32 rounding of
    # the data's scale, which a near-zero mean's relative error would not show
    scale = x64.abs().amax(-1)
    assert ((mean.double() - x64.mean(-1)).abs() <= 1e-6 * scale).all()
    assert rel(rstd, torch.rsqrt(x64.var(-1, unbiased=False) + 1e-5)) < 1e-4
    assert y.dtype == dtype and rel(y, y_ref) < limit
    split = hidden // ln_mod.spec.GROUPED_FWD_CONFIG.constexprs["BLOCK_N"]
    assert len(launches) == 1 and launches[0][0] % split == 0, launches


@pytest.mark.parametrize("hidden", [1024, 4096, 8192, 32768])
def test_norm_weight_grad_sums(hidden):
    """The whole-row and interleaved (32768) norm backwards sum the weight (and bias)
    gradient with atomic adds and a last-program cast (per column block, interleaved), or in
    torch's deterministic mode with per-program (per-chunk) partials. 20 runs of the atomic
    path all agree with the deterministic one (a race in the last program's read would show
    as a far-off or NaN run), and the deterministic path is bitwise repeatable."""
    from liger_aot.ops.layer_norm import layer_norm_backward
    from liger_aot.ops.rms_norm import _backward as rms_backward

    rows = 16384 if hidden <= 4096 else 8192
    x = torch.randn(rows, hidden, device=DEV, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(hidden, device=DEV, dtype=torch.bfloat16)
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)
    mean, ln_rstd = xf.mean(-1), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)

    def grads():
        return (rms_backward(dy, x, w, rstd, 0.0, 0)[1],
                *layer_norm_backward(dy, x, w, mean, ln_rstd)[1:])
    with deterministic_mode():
        exact = grads()
        assert all(torch.equal(a, b) for a, b in zip(exact, grads()))
    for _ in range(20):
        for got, want in zip(grads(), exact):
            assert rel(got, want) < 1e-2, rel(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_activations(dtype):
    from liger_aot.ops.geglu import geglu
    from liger_aot.ops.swiglu import swiglu

    a = torch.randn(2048, 14336, device=DEV, dtype=dtype)
    b = torch.randn(2048, 14336, device=DEV, dtype=dtype)
    check(swiglu, lambda a, b: F.silu(a) * b, a, b, dtype=dtype)
    check(geglu, lambda a, b: F.gelu(a, approximate="tanh") * b, a, b, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(dtype):
    from liger_aot.ops.rope import liger_rotary_pos_emb

    q = torch.randn(2, 32, 2048, 128, device=DEV, dtype=dtype)
    k = torch.randn(2, 8, 2048, 128, device=DEV, dtype=dtype)
    angle = torch.rand(1, 2048, 64, device=DEV, dtype=torch.float64) * 6.28
    angle = torch.cat([angle, angle], -1)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)

    def rot(t):
        return torch.cat((-t[..., 64:], t[..., :64]), -1)

    def ref(q, k):
        c, s = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
        return torch.cat([(q * c + rot(q) * s).flatten(), (k * c + rot(k) * s).flatten()])

    check(lambda q, k: torch.cat([t.flatten() for t in liger_rotary_pos_emb(q, k, cos, sin)]),
          ref, q, k, dtype=dtype)


@pytest.mark.parametrize("n_q,n_k,head_dim", [(3, 1, 16), (32, 8, 128), (14, 2, 64),
                                               (8, 4, 256), (20, 9, 320)])
def test_rope_fp32_equals_hf_formula_bitwise(n_q, n_k, head_dim):
    # compiled without fma contraction (kernel_src/rope/spec.py), both kernels (the last
    # shape's half dim 160 takes the looped one) round each product before the sum as
    # Hugging Face's elementwise formula does: the same fp32 bits, so a patched model's
    # rope cannot flip a near-tied choice (an MoE router's) that HF's makes
    from liger_aot.ops.rope import liger_rotary_pos_emb

    q = torch.randn(2, 64, n_q, head_dim, device=DEV).transpose(1, 2)
    k = torch.randn(2, 64, n_k, head_dim, device=DEV).transpose(1, 2)
    angle = torch.rand(1, 64, head_dim // 2, device=DEV) * 100
    angle = torch.cat([angle, angle], -1)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    half = head_dim // 2

    def hf(t):
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin

    qo, ko = liger_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0])
    assert torch.equal(qo, hf(q)) and torch.equal(ko, hf(k))


@pytest.mark.parametrize("vocab", [32000, 128256, 151936, 256000])
def test_cross_entropy(vocab):
    from liger_aot.ops.cross_entropy import cross_entropy

    logits = torch.randn(2048, vocab, device=DEV, dtype=torch.bfloat16) * 4
    target = torch.randint(0, vocab, (2048,), device=DEV)
    target[::7] = -100
    check(lambda x: cross_entropy(x, target), lambda x: F.cross_entropy(x, target), logits,
          dtype=torch.bfloat16)


@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_one_program_kernels(weighted):
    """reduction_scales and reduce_loss_rows (kernels.py), which run around the row kernel,
    against the torch reductions they replace: 8195 rows (two full blocks and a partial one),
    ignored and out-of-range targets, class weights."""
    from liger_aot.ops import cross_entropy as ce_mod

    n_rows, n_classes = 8195, 128256
    target = torch.randint(0, n_classes, (n_rows,), device=DEV)
    target[::5] = -100
    target[3] = n_classes + 7
    weight = torch.rand(n_classes, device=DEV) if weighted else None
    scales = ce_mod.reduction_scales(target, -100, weight)
    want = ce_mod._reduction_scales_torch(target, -100, weight)
    torch.testing.assert_close(scales, want, rtol=1e-5 if weighted else 0, atol=0)
    loss_rows, z_rows = torch.rand(n_rows, device=DEV) * 10, torch.rand(n_rows, device=DEV)
    acc_rows = (torch.rand(n_rows, device=DEV) > 0.5).float()
    for reduction in ("sum", "mean"):
        got = ce_mod.reduce_rows(loss_rows, z_rows, acc_rows, reduction, scales)
        ref = ce_mod._reduce_rows_torch(loss_rows, z_rows, acc_rows, reduction, scales)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=0)


STAGED_CE_CASES = [  # (rows, vocab, dtype, options)
    (4096, 128256, torch.bfloat16, {}),
    (4096, 128256, torch.float16, {"reduction": "sum"}),
    (3000, 151936, torch.bfloat16, {"label_smoothing": 0.1, "lse_square_scale": 1e-3}),
    (512, 256000, torch.bfloat16, {"reduction": "none", "lse_square_scale": 1e-2}),
    (7, 262144, torch.bfloat16, {"label_smoothing": 0.05}),  # split 32, fewer rows than groups
    (2500, 65536, torch.float16, {"reduction": "none"}),
]


@pytest.mark.parametrize("rows,vocab,dtype,options", STAGED_CE_CASES,
                         ids=[f"{r}x{v}-{str(d)[6:]}-{'-'.join(o) or 'mean'}"
                              for r, v, d, o in STAGED_CE_CASES])
def test_staged_cross_entropy(monkeypatch, rows, vocab, dtype, options):
    """The staged kernel (kernels.py: cross_entropy_fwd_staged, rows read once, split over a
    group of programs that exchange their statistics) through the op against float64 torch:
    loss and gradient, a seventh of the rows ignored, out of place and in place, both
    launches taken by the staged kernel; the z-loss comes back too. The loss alone takes the
    two-pass kernel (faster there)."""
    from test_op_cross_entropy import reference
    from liger_aot.ops import cross_entropy as ce_mod

    launches = []
    staged_launch = ce_mod._staged.launch
    monkeypatch.setattr(ce_mod._staged, "launch",
                        lambda *a, **k: launches.append(a[0]) or staged_launch(*a, **k))
    limit = 2e-2 if dtype == torch.bfloat16 else 2e-3
    logits = torch.randn(rows, vocab, device=DEV, dtype=dtype) * 3
    target = torch.randint(0, vocab, (rows,), device=DEV)
    target[::7] = -100
    target[1] = vocab - 1  # the last slice's last column
    x64 = logits.double().requires_grad_()
    ref, ref_z = reference(x64, target, **options)
    g = torch.rand_like(ref) + 0.5  # a grad_output other than 1: the scale kernel runs
    if g.dim():
        g[::3] *= -1  # reduction "none": some rows of negative grad_output
    ref.backward(g)
    for in_place in (False, True):
        x = logits.clone().requires_grad_()
        src = x * 1 if in_place else x  # in place needs a non-leaf
        loss, z = ce_mod.cross_entropy(src, target, in_place=in_place, return_z_loss=True,
                                       **options)
        assert rel(loss, ref) < 1e-5, in_place
        if ref_z.any():
            assert rel(z, ref_z) < 1e-5, in_place
        loss.backward(g)
        assert rel(x.grad, x64.grad) < limit, in_place
    with torch.no_grad():
        loss = ce_mod.cross_entropy(logits, target, **options)
    assert rel(loss, ref) < 1e-5
    assert len(launches) == 2 and all(grid[0] % ce_mod.spec.staged_split(vocab) == 0
                                      for grid in launches), launches


def test_fused_linear_cross_entropy():
    from liger_aot.ops.fused_linear_cross_entropy import fused_linear_cross_entropy

    x = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(128256, 4096, device=DEV, dtype=torch.bfloat16) * 0.02
    target = torch.randint(0, 128256, (4096,), device=DEV)
    target[::5] = -100
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, grads, g = grads_of(lambda x, w: fused_linear_cross_entropy(x, w, target), x, w)
    extra = torch.cuda.max_memory_allocated() - base
    # Reference in fp32 (a float64 4096x128256 logits matrix is 4 GB; fp32 is exact enough).
    ref_out, ref_grads, _ = grads_of(
        lambda x, w: F.cross_entropy(x.float() @ w.float().t(), target), x, w, grad=g.float())
    errors = [rel(out, ref_out)] + [rel(a, b) for a, b in zip(grads, ref_grads)]
    print(f"FLCE errors {errors}, peak beyond inputs {extra / 2**30:.2f} GiB")
    assert all(e < 2e-2 for e in errors), errors


def test_fused_linear_cross_entropy_none(monkeypatch):
    """Reduction "none": the backward recomputes each chunk's logits and scales their
    gradient by each row's grad_output inside the row kernel, here the staged one (131072
    classes), with rows of negative grad_output (the staged kernel's general path: a_coef <
    0 is not folded into the exponent) and ignored rows."""
    from liger_aot.ops import cross_entropy as ce_mod
    from liger_aot.ops.fused_linear_cross_entropy import fused_linear_cross_entropy

    launches = _record_launches(monkeypatch, ce_mod._staged)
    vocab = 131072
    x = torch.randn(1024, 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(vocab, 256, device=DEV, dtype=torch.bfloat16) * 0.05
    target = torch.randint(0, vocab, (1024,), device=DEV)
    target[::5] = -100
    out, grads, g = grads_of(
        lambda x, w: fused_linear_cross_entropy(x, w, target, reduction="none"), x, w)
    assert (g < 0).any() and (g > 0).any()
    ref_out, ref_grads, _ = grads_of(
        lambda x, w: F.cross_entropy(x.float() @ w.float().t(), target, reduction="none"),
        x, w, grad=g.float())
    errors = [rel(out, ref_out)] + [rel(a, b) for a, b in zip(grads, ref_grads)]
    assert len(grads) == 2 and all(e < 2e-2 for e in errors), errors
    assert launches, "the staged kernel did not run"


@pytest.mark.parametrize("dtype", DTYPES)
def test_distillation_losses(dtype):
    from liger_aot.ops.jsd import jsd
    from liger_aot.ops.kl_div import kl_div
    from liger_aot.ops.tvd import tvd

    x = torch.randn(512, 128256, device=DEV, dtype=dtype).log_softmax(-1)
    y = torch.randn(512, 128256, device=DEV, dtype=dtype).log_softmax(-1)
    check(lambda x: kl_div(x, y.exp(), reduction="batchmean"),
          lambda x: F.kl_div(x, y.double().exp(), reduction="batchmean"), x, dtype=dtype)

    def jsd_ref(x, beta=0.5):
        p, q = y.double().exp(), x.exp()  # Liger: input is the student (q), target the teacher
        m = beta * p + (1 - beta) * q
        return (beta * (p * (p.log() - m.log())).sum() +
                (1 - beta) * (q * (q.log() - m.log())).sum()) / x.shape[0]

    check(lambda x: jsd(x, y), jsd_ref, x, dtype=dtype)
    p, q = x.exp(), y.exp()
    check(lambda p: tvd(p, q, reduction="batchmean"), lambda p: 0.5 * (p - q.double()).abs().sum() / p.shape[0], p,
          dtype=dtype)


def test_cuda_graph_captures_a_training_step():
    """rms_norm -> swiglu -> cross_entropy forward and backward captured in one CUDA graph and
    replayed on new data: no host synchronisation anywhere in the ops."""
    from liger_aot.ops.cross_entropy import cross_entropy
    from liger_aot.ops.rms_norm import rms_norm
    from liger_aot.ops.swiglu import swiglu

    x = torch.randn(512, 1024, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(1024, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 1024, (512,), device=DEV)
    target[::3] = -100

    def step():
        h = rms_norm(x, w, in_place=False)
        loss = cross_entropy(swiglu(h, h), target)
        loss.backward()
        return loss

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up: load every variant before capture
            w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(stream)
    w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    graph_loss, graph_grad = static_loss.clone(), w.grad.clone()
    w.grad = None
    eager_loss = step()
    assert torch.allclose(graph_loss, eager_loss, rtol=1e-3), (graph_loss, eager_loss)
    assert rel(graph_grad, w.grad) < 1e-2


def test_torch_compile_fullgraph():
    from liger_aot.ops.cross_entropy import cross_entropy
    from liger_aot.ops.rms_norm import rms_norm
    from liger_aot.ops.rope import liger_rotary_pos_emb
    from liger_aot.ops.swiglu import swiglu

    x = torch.randn(4, 128, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    cos = torch.randn(1, 128, 64, device=DEV, dtype=torch.bfloat16)
    sin = torch.randn(1, 128, 64, device=DEV, dtype=torch.bfloat16)
    target = torch.randint(0, 256, (512,), device=DEV)

    def fn(x, w):
        h = rms_norm(x, w)
        q, k = liger_rotary_pos_emb(h.view(4, 128, 4, 64).transpose(1, 2),
                                    h.view(4, 128, 4, 64).transpose(1, 2), cos, sin)
        h = swiglu(q.transpose(1, 2).reshape(4, 128, 256), k.transpose(1, 2).reshape(4, 128, 256))
        return cross_entropy(h.reshape(512, 256), target)

    eager = fn(x, w)
    eager.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    compiled = torch.compile(fn, fullgraph=True)(x, w)
    compiled.backward()
    assert torch.allclose(compiled, eager, rtol=1e-3)
    assert rel(x.grad, gx) < 1e-2 and rel(w.grad, gw) < 1e-2
