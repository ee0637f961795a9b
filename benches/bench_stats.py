"""Throughput of ``Reader.stats`` beside the numpy way, and the view page's first paint.

Not a test: it prints figures, side by side in one run.

1. Statistics of ~``--mb`` MB of weights (fp32 and bf16, default codec and uncompressed):
   - ``Reader.stats()``: one parallel pass in the Rust core with the decode (crc checked);
   - numpy: ``load_file`` then, per tensor, ``np.isnan``/``np.isinf`` counts and
     ``np.nanmin``/``np.nanmax``/``np.nanmean``/``np.nanstd`` and the L2 norm on the float64
     cast (what people write; NaN-aware reductions as the reference needs), and also the
     cheaper float32-native variant (no cast; bf16 has to be cast anyway).
   GB/s are raw (decoded) bytes per second; best of ``--rounds``, rounds interleaved.
2. Time to first paint of ``shardpoint view`` for a ``--keys``-key checkpoint in headless
   chromium (selenium; performance paint timing), and the time to write the page.

    .venv/bin/python benches/bench_stats.py [--mb 1024] [--rounds 3] [--keys 100000]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

import shardpoint as sp

GB = 1e9


def best_of(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best wall time of each function, rounds interleaved (drift hits all alike)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            gc.collect()
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def weights(total_mb: int, dtype: object) -> dict[str, np.ndarray]:
    """~``total_mb`` MB of transformer-shaped tensors (normal, std 0.02), one NaN planted."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    n, i = 0, 0
    while n < total_mb * 1_000_000:
        shape = (1024, 1024) if i % 4 else (4096, 1024)
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)
        out[f"layer{i // 4}/w{i % 4}"] = a
        n += a.nbytes
        i += 1
    next(iter(out.values()))[0, 0] = np.nan
    return out


def numpy_stats(prefix: str, cast: bool) -> dict[str, tuple[float, ...]]:
    """load_file + the numpy reductions, float64 (cast) or native (bf16 is cast regardless)."""
    out = {}
    for k, a in sp.load_file(prefix).items():
        x = a.astype(np.float64) if cast or a.dtype == ml_dtypes.bfloat16 else a
        nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
        out[k] = (
            nan,
            inf,
            float(np.nanmin(x)),
            float(np.nanmax(x)),
            float(np.nanmean(x)),
            float(np.nanstd(x)),
            float(np.sqrt(np.nansum(x * x))),
        )
    return out


def stats_part(mb: int, rounds: int, tmp: str) -> None:
    print(f"== statistics of ~{mb} MB ({os.cpu_count()} CPUs), best of {rounds}")
    print(f"{'case':34} {'Reader.stats':>14} {'numpy f64':>14} {'numpy native':>14}  ratio")
    for dname, dt in (("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)):
        t = weights(mb, dt)
        raw = sum(a.nbytes for a in t.values())
        for comp in ("zstd", "none"):
            p = os.path.join(tmp, f"{dname}-{comp}")
            sp.save_file(t, p, compression=comp)

            def ours(p: str = p) -> object:
                with sp.open(p) as r:
                    return r.stats()

            best = best_of(
                {
                    "ours": ours,
                    "np64": lambda p=p: numpy_stats(p, True),
                    "npn": lambda p=p: numpy_stats(p, False),
                },
                rounds,
            )
            g = {k: raw / v / GB for k, v in best.items()}
            print(
                f"{dname + ' ' + comp:34} {g['ours']:10.2f} GB/s {g['np64']:9.2f} GB/s "
                f"{g['npn']:9.2f} GB/s  {best['np64'] / best['ours']:.1f}x / "
                f"{best['npn'] / best['ours']:.1f}x"
            )
            sp.remove(p)
        del t


def paint_part(keys: int, tmp: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    from shardpoint.inspection.page import write_page

    tensors = {f"model/layers.{i // 4}/m{i % 4}/w": np.full(4, i, np.float32) for i in range(keys)}
    p = os.path.join(tmp, "many")
    sp.save_file(tensors, p)
    html = os.path.join(tmp, "many.html")
    t0 = time.perf_counter()
    write_page(p, html, stats=True)
    t_write = time.perf_counter() - t0
    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    d = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts
    )
    try:
        paints, ready = [], []
        for _ in range(3):
            d.get("file://" + html)
            ready.append(float(d.execute_script("return document.body.dataset.readyAt")))
            fcp = d.execute_script(
                "return performance.getEntriesByType('paint')"
                ".filter(e => e.name === 'first-contentful-paint').map(e => e.startTime)[0]"
            )
            paints.append(fcp)
            rows = d.execute_script("return document.querySelectorAll('#list .row').length")
        d.execute_script(
            "document.getElementById('search').value='layers.2345/';"
            "document.getElementById('search').dispatchEvent(new Event('input'))"
        )
        t = time.perf_counter()
        found = d.execute_script("return document.querySelectorAll('#list .row').length")
        t_search = time.perf_counter() - t
    finally:
        d.quit()
    size = os.path.getsize(html)
    print(
        f"== view page, {keys:,} keys (stats included): file {size / 1e6:.1f} MB, "
        f"written in {t_write:.2f} s"
    )
    print(f"first contentful paint: {min(paints):.0f} ms (of {[round(x) for x in paints]}), "
          f"list rendered (script done) at {min(ready):.0f} ms; {rows} rows in the DOM; "
          f"search -> {found} rows (+{t_search * 1e3:.0f} ms round trip)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--skip-stats", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-stats-")
    try:
        if not args.skip_stats:
            stats_part(args.mb, args.rounds, tmp)
        paint_part(args.keys, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
