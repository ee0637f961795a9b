"""Lifetimes of non-reentrant checkpoints: nothing outlives what torch.utils.checkpoint frees.

Every scenario runs with ``shardpoint.activation.checkpoint`` and with
``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` side by side; weak references on the
inputs, the outputs and an autograd node (the context of a custom Function) tell what is still
alive after backward and ``gc.collect()``.
"""

from __future__ import annotations

import functools
import gc
import os
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
tuc = pytest.importorskip("torch.utils.checkpoint")

from shardpoint.activation import checkpoint, set_checkpoint_early_stop  # noqa: E402


class Square(torch.autograd.Function):
    """A custom Function whose ctx is a weak-referenceable autograd node."""

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return 2 * a * g


def body(a):
    return Square.apply(a.sin().exp()).sigmoid()


def ours(fn, *args, **kwargs):
    return checkpoint(fn, *args, **kwargs)


def theirs(fn, *args, **kwargs):
    return tuc.checkpoint(fn, *args, use_reentrant=False, **kwargs)


IMPLS = {"shardpoint": ours, "torch": theirs}


def one_step(ck, mode):
    """Run one checkpointed step in ``mode``; return weak refs to input, hidden input, output and
    the custom Function node."""
    x = torch.randn(64, requires_grad=True)
    h = x * 2
    fn = body
    if mode == "nested":

        def fn(a):
            return ck(body, a.cos()) * 2

    if mode == "nested3":

        def fn(a):
            return ck(lambda b: ck(body, b.cos()) + 1, a.tan()) * 2

    if mode in ("no_early_stop", "nested_no_early_stop"):
        with set_checkpoint_early_stop(False), tuc.set_checkpoint_early_stop(False):
            if mode == "nested_no_early_stop":
                y = ck(lambda a: ck(body, a.cos()) * 2, h)
            else:
                y = ck(fn, h)
    else:
        y = ck(fn, h)
    node = y.grad_fn
    while node is not None and not hasattr(node, "saved_tensors"):
        node = node.next_functions[0][0] if node.next_functions else None
    refs = [weakref.ref(x), weakref.ref(h), weakref.ref(y)]
    if mode == "retain_graph":
        y.sum().backward(retain_graph=True)
    elif mode == "grad":
        torch.autograd.grad(y.sum(), x)
    elif mode == "no_backward":
        pass
    else:
        y.sum().backward()
    return refs


MODES = [
    "plain",
    "retain_graph",
    "grad",
    "no_backward",
    "nested",
    "nested3",
    "no_early_stop",
    "nested_no_early_stop",
]


@pytest.mark.parametrize("mode", MODES)
def test_nothing_outlives_backward(mode):
    """50 steps: inputs, outputs and graph nodes are all collectable, for us as for torch."""
    alive = {}
    for name, ck in IMPLS.items():
        refs = [one_step(ck, mode) for _ in range(50)]
        gc.collect()
        alive[name] = [sum(r[i]() is not None for r in refs) for i in range(3)]
    assert alive["torch"] == [0, 0, 0], alive  # the reference frees everything
    assert alive["shardpoint"] == alive["torch"], alive


def test_autograd_nodes_die_after_backward():
    """The custom Function nodes (their ctx objects) of the checkpointed region die with the
    graph: after backward and after a recompute."""
    ctxs = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctxs.append(weakref.ref(ctx))
            ctx.save_for_backward(a)
            return a * 3

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return g * 3 + 0 * a

    for ck in IMPLS.values():
        ctxs.clear()
        for _ in range(20):
            x = torch.randn(16, requires_grad=True)
            ck(lambda t: Spy.apply(t.exp()).sin(), x).sum().backward()
        gc.collect()
        # forward + recompute node per step, all dead
        assert len(ctxs) == 40
        assert sum(r() is not None for r in ctxs) == 0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_hundred_steps_memory_stays_flat():
    """100 steps with a 4 MB input: resident memory does not grow with the step count (the
    leak kept every step's input and recomputed graph: ~1.5 GiB after 100 steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # elementwise work only; threads would just contend
    try:
        _hundred_steps()
    finally:
        torch.set_num_threads(threads)


def _hundred_steps():
    w = torch.randn(1024, requires_grad=True)

    def fn(t):
        # exp saves its own output: in the recompute graph that was the uncollectable cycle.
        return Square.apply((t * w).exp()).sin()

    def step():
        x = torch.ones(1024, 1024, requires_grad=True)  # 4 MiB
        checkpoint(fn, x).sum().backward()

    for _ in range(5):  # warm up the allocator
        step()
    gc.collect()
    before = _rss_bytes()
    inputs = []
    for _ in range(100):
        x = torch.ones(1024, 1024, requires_grad=True)
        inputs.append(weakref.ref(x))
        y = checkpoint(fn, x)
        y.sum().backward()
        del x, y
    gc.collect()
    grown = _rss_bytes() - before
    assert sum(r() is not None for r in inputs) == 0
    # One step holds about 5 tensors of 4 MiB; a leak of one input per step alone is 400 MiB.
    assert grown < 64 << 20, f"resident memory grew by {grown / 2**20:.0f} MiB over 100 steps"


def _sac_run(ck, fn, x):
    box = {}

    def context_fn():
        fwd, rec = tuc.create_selective_checkpoint_contexts([torch.ops.aten.mm.default])
        box["storage"] = fwd.storage
        return fwd, rec

    y = ck(fn, x, context_fn=context_fn)
    cached = [
        weakref.ref(entry.val)
        for per_op in box["storage"].values()
        for entry in per_op.values()
        if hasattr(entry, "val")
    ]
    return y, cached


def _sac_fn(a):
    b = torch.mm(a, a)
    c = b.sin()
    d = torch.mm(c, c)  # cached, needed by backward
    e = d.relu()
    return torch.mm(e, e).sum()  # cached, but recompute stops before it (early stop)


@pytest.mark.parametrize("name", list(IMPLS))
def test_selective_cache_freed_after_retain_graph_backward(name):
    """Selective-checkpoint caches: what the recompute consumed is freed by
    backward(retain_graph=True), the rest when the graph dies; a second backward raises
    torch's error. Same counts for both implementations."""
    x = torch.randn(8, 8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "saved_tensors_hooks around SAC" FutureWarning
        y, cached = _sac_run(IMPLS[name], _sac_fn, x)
        assert len(cached) == 3
        y.backward(retain_graph=True)
    gc.collect()
    alive_after_backward = sum(r() is not None for r in cached)
    with pytest.raises(RuntimeError, match="Trying to backward an extra time"):
        y.backward()
    del y
    gc.collect()
    assert sum(r() is not None for r in cached) == 0
    # The two mm outputs the recompute reached were consumed; only the one past the early
    # stop can remain while the graph is alive.
    assert alive_after_backward <= 1


def test_selective_cache_counts_match_torch():
    x = torch.randn(8, 8, requires_grad=True)
    counts = {}
    grads = {}
    for name, ck in IMPLS.items():
        x.grad = None
        y, cached = _sac_run(ck, _sac_fn, x)
        y.backward(retain_graph=True)
        gc.collect()
        counts[name] = sum(r() is not None for r in cached)
        grads[name] = x.grad.clone()
        del y
    assert counts["shardpoint"] == counts["torch"]
    assert torch.equal(grads["shardpoint"], grads["torch"])


def test_sac_policy_function_and_op_list_as_torch():
    """context_fn built by torch's create_selective_checkpoint_contexts (policy function and op
    list): same gradients as torch and as no checkpointing, and mm is not re-run."""
    calls = {"mm": 0}
    CP = tuc.CheckpointPolicy

    def policy(ctx, op, *args, **kwargs):
        if op is torch.ops.aten.mm.default:
            if not ctx.is_recompute:
                calls["mm"] += 1
            return CP.MUST_SAVE
        return CP.PREFER_RECOMPUTE

    def fn(a, b):
        return torch.sigmoid(torch.mm(torch.mm(a, b), b)) * b

    a = torch.randn(6, 6, requires_grad=True)
    b = torch.randn(6, 6, requires_grad=True)
    expected = torch.autograd.grad(fn(a, b).sum(), (a, b))
    for spec in (policy, [torch.ops.aten.mm.default]):
        for ck in IMPLS.values():
            ctx_fn = functools.partial(tuc.create_selective_checkpoint_contexts, spec)
            got = torch.autograd.grad(ck(fn, a, b, context_fn=ctx_fn).sum(), (a, b))
            assert all(torch.allclose(g, e) for g, e in zip(got, expected, strict=True))
    assert calls["mm"] == 4  # two mm per forward, policy consulted in forward only
