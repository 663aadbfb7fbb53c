"""The torch decoder's Triton kernels against the CPU bodies of its custom ops (`specchat.engine.decoder_ops`) and
the attention reference: on a GPU for real, on a CPU in the interpreter (conftest sets TRITON_INTERPRET=1)."""

from __future__ import annotations

import functools

import pytest
import torch
from attention_oracle import random_tree_mask

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from specchat.engine import decoder_ops as ops
from specchat.kernels.attention import graph_attention, reference
from specchat.kernels.attention.graph_attention import body_splits, graph_prefix_attention, graph_tree_attention
from specchat.kernels.layer_kernels import rms_norm, rope_write, silu_mul

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}  # the interpreter truncates fp32 -> bf16
DTYPES = [torch.float32, torch.bfloat16]
# The attention kernels' dtypes and the body pass's two ways to read K and V (pointer loads, and Hopper's tensor
# descriptors): a GPU runs every pair; the interpreter (~1 ms of Python an op) each way in one of the dtypes.
KV_READS = [(reads, dtype) for reads in ("pointers", "descriptors") for dtype in DTYPES]
if DEVICE.type == "cpu":
    KV_READS = [("pointers", torch.bfloat16), ("descriptors", torch.float32)]


@pytest.fixture(params=KV_READS, ids=lambda pair: f"{pair[0]}-{str(pair[1]).removeprefix('torch.')}")
def dtype(request, monkeypatch) -> torch.dtype:
    """The dtype an attention test runs in, its K and V read one of the two ways (tensor descriptors forced on in
    the interpreter, which models their loads: whole blocks, zeros past the tensor's end)."""
    reads, dtype = request.param
    if reads == "descriptors" and DEVICE.type == "cpu":
        monkeypatch.setattr(graph_attention, "copy_engine", lambda device: True)
    elif reads == "descriptors" and not graph_attention.copy_engine(DEVICE):
        pytest.skip("tensor descriptors: Hopper or later")
    elif reads == "pointers" and DEVICE.type == "cuda":
        monkeypatch.setattr(graph_attention, "copy_engine", lambda device: False)
    return dtype


def _close(got, want, dtype):
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=tolerance, rtol=tolerance)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "lengths, n, heads, kv_heads, dim",
    [((0, 5, 300), 1, 4, 2, 64), ((7, 130), 9, 8, 2, 128), ((0, 64, 200), 13, 3, 1, 80)],
)
def test_one_launch_serves_every_length(lengths, n, heads, kv_heads, dim, dtype):
    """The same tensors, the length changed on the device between calls (as between graph replays)."""
    capacity = max(lengths) + n + 3
    k = _randn(kv_heads, capacity, dim, seed=1).to(DEVICE, dtype)
    v = _randn(kv_heads, capacity, dim, seed=2).to(DEVICE, dtype)
    q = _randn(n, heads, dim, seed=3).to(DEVICE, dtype)
    mask = random_tree_mask(n, torch.Generator().manual_seed(n)).to(DEVICE)
    length = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for prefix in lengths:
        length.fill_(prefix)
        got = graph_tree_attention(q, k, v, length, mask, dim**-0.5)
        want = reference.hybrid_tree_attention(q.transpose(0, 1)[None], k[None], v[None], prefix, mask, dim**-0.5)
        assert got.dtype == dtype and got.shape == (n, heads, dim)
        _close(got, want[0].transpose(0, 1), dtype)


@pytest.mark.parametrize("n, heads, kv_heads, dim", [(1, 4, 2, 64), (16, 8, 2, 128), (5, 3, 1, 80)])
def test_a_prefix_read_serves_every_length(n, heads, kv_heads, dim, dtype):
    """Every row over the first `length` slots (a draft layer's cross-attention to the target's cache), the length
    changed on the device between calls; a cache of length 0 reads zeros."""
    capacity = 400
    k = _randn(kv_heads, capacity, dim, seed=1).to(DEVICE, dtype)
    v = _randn(kv_heads, capacity, dim, seed=2).to(DEVICE, dtype)
    q = _randn(n, heads, dim, seed=3).to(DEVICE, dtype)
    length = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for prefix in (0, 1, 127, 128, 300, capacity):
        length.fill_(prefix)
        got = graph_prefix_attention(q, k, v, length, dim**-0.5)
        assert got.dtype == dtype and got.shape == (n, heads, dim)
        if prefix == 0:
            assert not got.any()
            continue
        group = heads // kv_heads
        keys, values = k[:, :prefix].repeat_interleave(group, 0), v[:, :prefix].repeat_interleave(group, 0)
        want = torch.softmax(q.transpose(0, 1).float() @ keys.float().transpose(1, 2) * dim**-0.5, -1) @ values.float()
        _close(got, want.transpose(0, 1), dtype)


def test_the_output_padded_for_the_products_after_it(dtype):
    """Asked for more rows than it has queries (a forward's rows padded to its products' count), the attention
    writes its rows' own bits and zeros past them; so does the op's CPU body."""
    heads, kv_heads, dim, prefix, n, width = 4, 2, 64, 150, 5, 16
    k = _randn(1, 1, kv_heads, prefix + width, dim, seed=1).to(DEVICE, dtype)
    v = _randn(1, 1, kv_heads, prefix + width, dim, seed=2).to(DEVICE, dtype)
    q = _randn(n, heads, dim, seed=3).to(DEVICE, dtype)
    mask = random_tree_mask(n, torch.Generator().manual_seed(n)).to(DEVICE)
    length = torch.tensor([prefix], dtype=torch.int32, device=DEVICE)
    for attention in (graph_tree_attention, ops.tree_attention):
        call = functools.partial(graph_tree_attention, q, k[0, 0], v[0, 0], length, mask, dim**-0.5, False)
        if attention is ops.tree_attention:
            call = functools.partial(ops.tree_attention, q, k, v, 0, length, mask, dim**-0.5, False)
        rows, padded = call(n), call(width)
        assert padded.shape == (width, heads, dim) and padded.dtype == dtype
        assert torch.equal(padded[:n], rows) and not padded[n:].any()


def test_a_split_no_row_reaches_is_neither_written_nor_read(dtype, monkeypatch):
    """A short context in a large cache leaves most body splits empty: their outputs are not written and the merge
    does not read them (partials start as NaN here, where a read would show), and every row keeps its bits."""
    heads, kv_heads, dim, n, capacity = 4, 2, 64, 5, 2048  # 16 splits of 128 keys in the interpreter
    k = _randn(kv_heads, capacity, dim, seed=1).to(DEVICE, dtype)
    v = _randn(kv_heads, capacity, dim, seed=2).to(DEVICE, dtype)
    q = _randn(n, heads, dim, seed=3).to(DEVICE, dtype)
    mask = random_tree_mask(n, torch.Generator().manual_seed(n)).to(DEVICE)
    length = torch.tensor([300], dtype=torch.int32, device=DEVICE)
    calls = [functools.partial(graph_tree_attention, q, k, v, length, mask, dim**-0.5),
             functools.partial(graph_prefix_attention, q, k, v, length, dim**-0.5)]  # fmt: skip
    plain = [call() for call in calls]
    empty = torch.empty

    def poisoned(*shape, **options):
        out = empty(*shape, **options)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    with monkeypatch.context() as patch:
        patch.setattr(torch, "empty", poisoned)
        for call, want in zip(calls, plain):
            assert torch.equal(call(), want)


@triton.jit
def _split_blocks_of(Ends, Out, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, LEAST: tl.constexpr):
    ends = tl.load(Ends + tl.arange(0, 64))
    tl.store(Out + tl.arange(0, 64), graph_attention._split_blocks(ends, SPLITS, BLOCK_N, LEAST))


@pytest.mark.parametrize("splits, block_n, least", [(32, 64, 8), (32, 128, 4), (4, 64, 1)])
def test_a_rows_splits_hold_the_fewest_blocks_that_cover_its_body(splits, block_n, least):
    """The split length a row's body gives: the least power of two of key blocks, `least` at the fewest, with which
    the splits cover the body (the GPU's shapes and the interpreter's)."""
    ends = torch.tensor([0, 1, 63, 64, 511, 512, 513, 2047, 2048, 2049, 4032, 32704, 32768, 32769, 131008, 1 << 20]
                        + list(range(250, 298)), dtype=torch.int32)  # fmt: skip
    blocks = torch.empty_like(ends, device=DEVICE)
    _split_blocks_of[(1,)](ends.to(DEVICE), blocks, splits, block_n, least)
    for end, count in zip(ends.tolist(), blocks.tolist()):
        assert count >= least and count & (count - 1) == 0, (end, count)  # a power of two
        assert splits * count * block_n >= end, (end, count)  # they cover the body
        assert count == least or splits * count // 2 * block_n < end, (end, count)  # and half as many would not
    assert body_splits(64) == ((4, 1) if DEVICE.type == "cpu" else (32, 8))


def _decoded(q, k, v, prefix: int, ancestors: list[int], scale: float) -> torch.Tensor:
    """The decode step of the row whose ancestors in the tree slots after `prefix` are `ancestors`: a cache (of
    another capacity: the split bounds are the position's alone) holding them at the positions after the prefix,
    the row's own key last."""
    slots = torch.tensor([prefix + a for a in ancestors], device=k.device)
    spare = torch.zeros(k.shape[0], 700, k.shape[2], dtype=k.dtype, device=k.device)
    k, v = torch.cat([k, spare], dim=1), torch.cat([v, spare], dim=1)
    k[:, prefix : prefix + len(ancestors)], v[:, prefix : prefix + len(ancestors)] = k[:, slots], v[:, slots]
    length = torch.tensor([prefix + len(ancestors) - 1], dtype=torch.int32, device=k.device)
    one = torch.ones(1, 1, dtype=torch.bool, device=k.device)
    return graph_tree_attention(q[None], k, v, length, one, scale)[0]


@pytest.mark.parametrize("prefix, n", [(0, 5), (30, 9), (130, 24), (320, 20), (576, 13)])
def test_a_tree_row_is_bitwise_the_decode_step_at_its_position(prefix, n, dtype):
    """Exactness on CUDA: each row of a random tree, whatever rows share its call and however its prefix's split
    bounds fall, gets the bits of the decode step of its token after its ancestors (prefixes that cross split
    bounds, and rows whose bodies straddle a split length: 4 x 64 and 4 x 128 keys in the interpreter). The
    interpreter checks the last row at each depth: a depth's rows share their position, so their split bounds and
    their code, and a decode step costs it about a second."""
    heads, kv_heads, dim = 4, 2, 64
    capacity = prefix + n + 70
    k = _randn(kv_heads, capacity, dim, seed=1).to(DEVICE, dtype)
    v = _randn(kv_heads, capacity, dim, seed=2).to(DEVICE, dtype)
    q = _randn(n, heads, dim, seed=3).to(DEVICE, dtype)
    mask = random_tree_mask(n, torch.Generator().manual_seed(n)).to(DEVICE)
    tree = graph_tree_attention(q, k, v, torch.tensor([prefix], dtype=torch.int32, device=DEVICE), mask, dim**-0.5)
    depths = (mask.sum(1) - 1).tolist()
    rows = range(n) if DEVICE.type == "cuda" else sorted({depth: row for row, depth in enumerate(depths)}.values())
    for row in rows:
        ancestors = mask[row].nonzero()[:, 0].tolist()
        assert torch.equal(tree[row], _decoded(q[row], k, v, prefix, ancestors, dim**-0.5)), f"row {row}"


def test_a_prefill_row_is_bitwise_the_decode_step_at_its_position(dtype):
    """A causal forward of any length (here 100 rows, past the deepest tree) reads its own keys in place; its rows'
    bodies straddle a split length (and a body program's rows, two heads' ends, lie far apart)."""
    heads, kv_heads, dim, n, prefix = 2, 1, 64, 100, 230
    k = _randn(kv_heads, prefix + n + 10, dim, seed=4).to(DEVICE, dtype)
    v = _randn(kv_heads, prefix + n + 10, dim, seed=5).to(DEVICE, dtype)
    q = _randn(n, heads, dim, seed=6).to(DEVICE, dtype)
    causal = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril_()
    rows = graph_tree_attention(q, k, v, torch.tensor([prefix], dtype=torch.int32, device=DEVICE), causal, dim**-0.5,
                                causal=True)  # fmt: skip
    want = reference.hybrid_tree_attention(q.transpose(0, 1)[None], k[None], v[None], prefix, causal, dim**-0.5)
    _close(rows, want[0].transpose(0, 1), dtype)
    for row in (0, 63, 64, 99):
        assert torch.equal(rows[row], _decoded(q[row], k, v, prefix + row, [0], dim**-0.5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_silu_mul_match_the_ops_cpu_bodies(dtype):
    x = _randn(3, 96, seed=4).to(dtype)
    weight = (1 + _randn(96, seed=5) / 4).to(dtype)
    _close(rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-5), ops.rms_norm(x, weight, 1e-5), dtype)
    gate_up = (2 * _randn(3, 2 * 1500, seed=6)).to(dtype)
    _close(silu_mul(gate_up.to(DEVICE)), ops.silu_mul(gate_up), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_write_matches_the_ops_cpu_body(dtype, qk_norm):
    n, heads, kv_heads, dim, capacity, prefix = 5, 4, 2, 32, 20, 6
    qkv = _randn(n, (heads + 2 * kv_heads) * dim, seed=7).to(dtype)
    positions = torch.tensor([6, 7, 7, 8, 40])
    angles = torch.arange(64).float()[:, None] * (1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim))
    cos, sin = angles.cos(), angles.sin()
    norms = (1 + _randn(2, dim, seed=8) / 4).to(dtype) if qk_norm else None
    length = torch.tensor([prefix], dtype=torch.int32)
    caches = [torch.zeros(2, 1, kv_heads, capacity, dim, dtype=dtype) for _ in range(4)]
    want = ops.rope_write(qkv, positions, cos, sin, length, caches[0], caches[1], 1, norms, 1e-6)
    k, v = (c.to(DEVICE) for c in caches[2:])
    got = rope_write(*(t.to(DEVICE) for t in (qkv, positions, cos, sin, length)), k[1, 0], v[1, 0],
                     None if norms is None else norms.to(DEVICE), 1e-6)  # fmt: skip
    _close(got, want, dtype)
    _close(k, caches[0], dtype)
    _close(v, caches[1], dtype)
    assert caches[0][1, 0, :, prefix : prefix + n].abs().sum() > 0 and k[0].abs().sum() == 0
