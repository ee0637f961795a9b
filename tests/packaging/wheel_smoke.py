"""Smoke test of an installed shardpoint wheel, run by `make test-wheel` inside a fresh virtual
environment, from a temporary directory (so nothing of the source tree can be imported).

It checks what a user of the wheel gets:
1. the package imports from site-packages (not from a checkout) and round-trips a save/load;
2. the `shardpoint` console script works (ls, info, verify);
3. `python -m shardpoint.demo --scale 0.01` runs;
4. every extra the docs name exists in the wheel's metadata, and each feature module only imports
   (at any depth, lazily or not) third-party packages that its extra, or the base dependencies,
   install. Imports guarded by `except ImportError` are optional and skipped. The closure of an
   extra is computed from the installed distributions' metadata, offline;
5. each extra's feature modules import, and the frameworks they name import;
6. the pytest plugin beside the package (`_shardpoint_plugin`) is registered, imports nothing
   heavy, and registers the Hypothesis profiles.

Not collected by pytest (its name does not start with test_); run it as a script.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement

# Which extra a feature module (and everything under it) needs. A module not listed here, or
# under a listed one, needs only the base dependencies. The most specific entry wins.
FEATURE_EXTRA: dict[str, str] = {
    "shardpoint.torch": "torch",
    "shardpoint.activation": "torch",
    "shardpoint.convert.torch_io": "torch",
    "shardpoint.jax": "jax",
    "shardpoint.jax.orbax": "orbax",
    "shardpoint.keras": "keras",
    "shardpoint.integrations": "torch",
    "shardpoint.integrations.lightning": "lightning",
    "shardpoint.integrations._lightning_io": "lightning",
    "shardpoint.integrations._lightning_reader": "lightning",
    "shardpoint.integrations._lightning_tiers": "lightning",
    "shardpoint.integrations.hf_trainer": "transformers",
    "shardpoint.integrations._hf_tiers": "transformers",
    "shardpoint.integrations._hf_args": "transformers",
    "shardpoint.integrations.accelerate": "accelerate",
    "shardpoint.integrations.deepspeed": "deepspeed",
    "shardpoint.integrations.zero_to_fp32": "deepspeed",
    "shardpoint.hf": "transformers",
    "shardpoint.integrations._deepspeed_engine": "deepspeed",
    "shardpoint.integrations._deepspeed_tiers": "deepspeed",
    "shardpoint.signing": "signing",
    "shardpoint.testing.strategies": "testing",
    "shardpoint.testing.stateful": "testing",
}
# Modules imported only when a value of their package is saved or read (shardpoint/__init__
# declares them lazily): the user already has that package, so no extra installs it.
ACTIVATED_BY_VALUES: dict[str, tuple[str, ...]] = {
    "shardpoint.storage.omegaconf_objects": ("omegaconf",),
    # PEFT adapters are written as PEFT writes them when the model is a PeftModel
    "shardpoint.integrations._hf_weights": ("peft",),
    # jax arrays are compared/round-tripped when the user's value holds some
    "shardpoint.testing._frameworks": ("jax",),
    "shardpoint.testing.roundtrip": ("jax",),
    # a torch tensor given to encode/apply: torch is imported to view its bytes
    "shardpoint.delta.sync": ("torch",),
    # the tiers' collectives run over the job's torch.distributed group, when one is used
    "shardpoint.tiers.group": ("torch",),
}
# Serving engines pin their own torch, so their extras are not installed beside the others
# (Makefile EXTRAS): each engine module's imports must be named by its extra's metadata instead.
ENGINE_EXTRA: dict[str, str] = {"shardpoint.vllm": "vllm", "shardpoint.sglang": "sglang"}
# The extras the docs name (README, docs/*.md): each must exist in the wheel's metadata.
DOCUMENTED_EXTRAS = ("torch", "jax", "orbax", "hf", "dtypes", "testing")
# Frameworks an extra must make importable (checked after installing every extra).
EXTRA_PROVIDES: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "ml_dtypes"),
    "jax": ("jax", "ml_dtypes"),
    "orbax": ("jax", "orbax.checkpoint"),
    "hf": ("huggingface_hub", "safetensors", "ml_dtypes"),
    "dtypes": ("ml_dtypes",),
    "testing": ("hypothesis", "pytest", "ml_dtypes"),
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
# what the base install provides under its import names
BASE_TOPS = {"numpy", "ml_dtypes"}


def step(msg: str) -> float:
    print(f"[wheel-smoke] {msg}", flush=True)
    return time.perf_counter()


def check_installed_location() -> Path:
    import shardpoint

    pkg = Path(shardpoint.__file__).resolve().parent
    site = {Path(p).resolve() for p in sys.path if p.endswith("site-packages")}
    assert any(pkg.is_relative_to(s) for s in site), (
        f"shardpoint imported from {pkg}, not site-packages"
    )
    assert not (pkg.parent / "Cargo.toml").exists(), f"{pkg} looks like a source checkout"
    return pkg


def roundtrip(tmp: Path) -> Path:
    import numpy as np

    import shardpoint as sp

    w = np.arange(1 << 18, dtype=np.float32).reshape(512, 512)
    prefix = tmp / "ckpt"
    sp.save_file({"w": w, "step": 7, "note": "hi"}, str(prefix), metadata={"epoch": 1})
    back = sp.load_file(str(prefix))
    assert np.array_equal(back["w"], w) and back["step"] == 7 and back["note"] == "hi", back.keys()
    with sp.open(str(prefix)) as r:
        assert sorted(r.keys()) == ["note", "step", "w"]
        r.verify()
    return prefix


def cli(prefix: Path) -> None:
    exe = Path(sys.executable).parent / "shardpoint"
    assert exe.exists(), f"console script missing: {exe}"
    for args in (["ls", str(prefix)], ["info", str(prefix)], ["verify", str(prefix)]):
        out = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (
            f"shardpoint {' '.join(args)} exited {out.returncode}: {out.stderr}"
        )
    ls = subprocess.run([str(exe), "ls", str(prefix)], capture_output=True, text=True, timeout=120)
    assert "w" in ls.stdout, ls.stdout
    # The page is a packaged data file (inspection/view.html), not a module: check it shipped.
    page = prefix.parent / "view.html"
    out = subprocess.run(
        [str(exe), "view", str(prefix), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"shardpoint view exited {out.returncode}: {out.stderr}"
    html = page.read_text()
    assert "<html" in html.lower() and '"w"' in html, html[:500]


def demo() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shardpoint.demo", "--scale", "0.01"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"demo exited {out.returncode}:\n{out.stdout}\n{out.stderr}"


def extra_of(module: str) -> str | None:
    best = None
    for prefix, extra in FEATURE_EXTRA.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, extra)
    return best[1] if best else None


def closure(dist: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Normalised names of `dist` and everything it requires (with `extras`), from metadata."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(dist, extras)]
    while todo:
        name, ex = todo.pop()
        key = (name.lower().replace("_", "-"), ex)
        if key[0] in seen and not ex:
            continue
        seen.add(key[0])
        try:
            reqs = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for line in reqs:
            req = Requirement(line)
            envs = [{"extra": e} for e in ex] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in envs):
                continue
            todo.append((req.name, tuple(sorted(req.extras))))
    return seen


def providers() -> dict[str, set[str]]:
    """Top-level import name -> normalised distribution names that provide it."""
    return {
        mod: {d.lower().replace("_", "-") for d in dists}
        for mod, dists in md.packages_distributions().items()
    }


def guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """True when an import sits in a `try` whose handlers catch ImportError."""
    cur = node
    while cur in parents:
        cur = parents[cur]
        if isinstance(cur, ast.Try):
            for h in cur.handlers:
                names = []
                if h.type is None:
                    return True
                for t in h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]:
                    names.append(getattr(t, "id", getattr(t, "attr", "")))
                if {"ImportError", "ModuleNotFoundError", "Exception"} & set(names):
                    return True
    return False


def third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if guarded(node, parents):
            continue
        for n in names:
            top = n.split(".")[0]
            if top not in STDLIB and top != "shardpoint":
                found.add(top)
    return found


def present_features(pkg: Path) -> dict[str, str]:
    """The FEATURE_EXTRA entries whose module ships in this wheel."""
    out = {}
    for module, extra in FEATURE_EXTRA.items():
        rel = Path(*module.split(".")[1:])
        if (pkg / rel).with_suffix(".py").exists() or (pkg / rel / "__init__.py").exists():
            out[module] = extra
    return out


def engine_problems(module: str, extra: str, path: Path, meta: md.PackageMetadata) -> list[str]:
    """An engine module may import its engine and what the engine itself requires (torch...):
    its extra must name the engine; torch and the rest come with the engine."""
    names = set()
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}):
            names.add(req.name.lower().replace("_", "-"))
    if extra not in names:
        return [f"extra [{extra}] does not require {extra}, which {module} loads into"]
    engine_deps = {"torch", "transformers", extra}
    return [
        f"{module} imports {top!r}, which neither [{extra}] nor {extra} itself installs"
        for top in sorted(third_party_imports(path))
        if top not in engine_deps and top not in names and top not in BASE_TOPS
    ]


def check_extras(pkg: Path) -> None:
    meta = md.metadata("shardpoint")
    declared = set(meta.get_all("Provides-Extra") or [])
    needed = set(DOCUMENTED_EXTRAS) | set(present_features(pkg).values())
    missing = sorted(needed - declared)
    assert not missing, f"extras named by the docs or features but absent from the wheel: {missing}"
    prov = providers()
    base = closure("shardpoint")
    problems = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        engine = next(
            (e for m, e in ENGINE_EXTRA.items() if module.split(".")[:2] == m.split(".")), None
        )
        if engine is not None:
            problems += engine_problems(module, engine, path, meta)
            continue
        extra = extra_of(module)
        allowed = base | (closure("shardpoint", (extra,)) if extra else set())
        for top in sorted(third_party_imports(path)):
            if top in ACTIVATED_BY_VALUES.get(module, ()):
                continue
            dists = prov.get(top)
            if not dists:
                problems.append(
                    f"{module} imports {top!r}, which no installed distribution provides"
                )
            elif not dists & allowed:
                problems.append(
                    f"{module} imports {top!r} ({', '.join(sorted(dists))}) but "
                    f"{'extra [' + extra + ']' if extra else 'the base install'} does not install it"
                )
    assert not problems, "\n".join(problems)


def check_imports(pkg: Path) -> None:
    for mods in EXTRA_PROVIDES.values():
        for m in mods:
            importlib.import_module(m)
    features = present_features(pkg)
    for module in features:
        importlib.import_module(module)
    print(f"[wheel-smoke] imported {len(features)} feature modules: {', '.join(features)}")


def check_plugin() -> None:
    """The pytest/Hypothesis plugin ships beside the package, is registered under both entry
    points, imports nothing when pytest loads it, and registers the profiles with Hypothesis."""
    eps = {(e.group, e.value) for g in ("pytest11", "hypothesis") for e in md.entry_points(group=g)}
    assert ("pytest11", "_shardpoint_plugin") in eps, eps
    assert ("hypothesis", "_shardpoint_plugin:_hypothesis_setup_hook") in eps, eps
    code = (
        "import sys, _shardpoint_plugin as p\n"
        "heavy = [m for m in ('numpy', 'shardpoint', 'hypothesis') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert 'site-packages' in p.__file__, p.__file__\n"
        "from hypothesis import settings\n"
        "assert settings.get_profile('ci').derandomize\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def check_torch_load(tmp: Path) -> None:
    """The startup file shipped at site-packages' root makes a fresh interpreter's torch.load
    read a shardpoint single file, without importing shardpoint in the script."""
    import torch

    import shardpoint.torch as sptorch

    path = tmp / "model.pt"
    sptorch.save({"w": torch.arange(6.0)}, str(path))
    assert path.read_bytes()[:8] == b"SPSINGLE"
    code = (
        "import sys, torch\n"
        "d = torch.load(sys.argv[1], map_location='cpu', weights_only=True)\n"
        "assert d['w'].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], d\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    site = Path(sysconfig.get_path("purelib"))
    assert (site / "shardpoint_loaders.pth").is_file(), sorted(p.name for p in site.iterdir())


def main() -> None:
    t0 = step(f"python {sys.version.split()[0]} at {sys.executable}")
    pkg = check_installed_location()
    with tempfile.TemporaryDirectory() as d:
        step("save/load round trip")
        prefix = roundtrip(Path(d))
        step("console script: ls, info, verify, view")
        cli(prefix)
    step("python -m shardpoint.demo --scale 0.01")
    demo()
    step("extras: metadata closure covers every feature module's imports")
    check_extras(pkg)
    step("extras: feature modules and their frameworks import")
    check_imports(pkg)
    step("pytest plugin and Hypothesis profiles (shardpoint[testing])")
    check_plugin()
    step("torch.load in a fresh interpreter reads a shardpoint file (startup file)")
    with tempfile.TemporaryDirectory() as d:
        check_torch_load(Path(d))
    print(f"[wheel-smoke] passed in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
