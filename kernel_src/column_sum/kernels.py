"""Column sums of fp32 partial rows, written in the output dtype: OUT[j] = sum_p PARTIAL[p, j]
(and OUT2 from PARTIAL2 when has_second). The norms' backwards leave one fp32 row of weight
(and bias) gradient per program; this reduces and casts them in one launch, where
torch's `partial.sum(0).to(dtype)` takes two per gradient. PARTIAL is (n_parts, n_cols),
contiguous. The sum is in fp32, in a fixed order (deterministic)."""
import triton
import triton.language as tl


@triton.jit
def _column_sum(OUT, PARTIAL, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                STAGES: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in tl.range(0, n_parts, BLOCK_P, num_stages=STAGES):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts < n_parts)[:, None] & col_mask[None, :]
        acc += tl.load(PARTIAL + parts.to(tl.int64)[:, None] * n_cols + cols[None, :],
                       mask=mask, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=col_mask)


@triton.jit
def column_sum(OUT, PARTIAL, OUT2, PARTIAL2, n_parts, n_cols, has_second,
               BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    _column_sum(OUT, PARTIAL, n_parts, n_cols, BLOCK_P, BLOCK_N, STAGES)
    if has_second != 0:
        _column_sum(OUT2, PARTIAL2, n_parts, n_cols, BLOCK_P, BLOCK_N, STAGES)
