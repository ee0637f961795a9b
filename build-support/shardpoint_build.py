"""PEP 517 build backend of shardpoint: maturin's, with one change.

maturin's backend silently downloads a whole Rust toolchain (~1 GB, through `puccinialin`) into a
cache directory when `cargo` is not on PATH. A user installing from source should instead be told,
at once, what is missing and what the choices are. So this wrapper:

- when cargo is on PATH, delegates every hook to maturin unchanged;
- when it is not, stops with a clear message (the hooks that only describe the build, like
  `get_requires_for_build_*`, stop too, so pip prints it before downloading anything), unless
  the user opts into maturin's download with SHARDPOINT_BUILD_FETCH_RUST=1.

It sets MATURIN_NO_INSTALL_RUST=1 for maturin, so maturin never adds `puccinialin` on its own.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

_FETCH_ENV = "SHARDPOINT_BUILD_FETCH_RUST"

_MESSAGE = """
shardpoint: building from source needs a Rust toolchain (cargo and rustc >= 1.89), and `cargo`
is not on PATH.

  * Prefer a prebuilt wheel: `pip install shardpoint` picks one on Linux x86-64 (glibc >= 2.17,
    CPython >= 3.11); `pip install --only-binary shardpoint shardpoint` refuses source builds.
  * Or install Rust (your system's package manager, or https://rustup.rs) and retry.
  * Or set SHARDPOINT_BUILD_FETCH_RUST=1 to let the build download a temporary Rust toolchain
    (about 1 GB) into a cache directory.
"""


def _check_toolchain() -> None:
    if shutil.which("cargo") is not None:
        os.environ["MATURIN_NO_INSTALL_RUST"] = "1"
        return
    if os.environ.get(_FETCH_ENV) == "1":
        os.environ.pop("MATURIN_NO_INSTALL_RUST", None)
        return
    sys.stderr.write(_MESSAGE)
    raise SystemExit("shardpoint: no Rust toolchain (cargo) on PATH; see the message above")


def _maturin() -> Any:
    _check_toolchain()
    import maturin

    return maturin


Config = Mapping[str, Any] | None


def get_requires_for_build_wheel(config_settings: Config = None) -> list[str]:
    """Extra build requirements (none beyond maturin when cargo is present)."""
    return list(_maturin().get_requires_for_build_wheel(config_settings))


def get_requires_for_build_sdist(config_settings: Config = None) -> list[str]:
    """An sdist needs no compiler; maturin still inspects the crate with cargo metadata."""
    return list(_maturin().get_requires_for_build_sdist(config_settings))


def get_requires_for_build_editable(config_settings: Config = None) -> list[str]:
    """Same as for a wheel."""
    return list(_maturin().get_requires_for_build_editable(config_settings))


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Config = None
) -> str:
    """Writes the .dist-info directory (maturin's hook)."""
    return str(_maturin().prepare_metadata_for_build_wheel(metadata_directory, config_settings))


def build_wheel(
    wheel_directory: str, config_settings: Config = None, metadata_directory: str | None = None
) -> str:
    """Compiles the extension and builds the wheel (maturin's hook)."""
    return str(_maturin().build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(
    wheel_directory: str, config_settings: Config = None, metadata_directory: str | None = None
) -> str:
    """Editable install (maturin's hook)."""
    return str(_maturin().build_editable(wheel_directory, config_settings, metadata_directory))


def build_sdist(sdist_directory: str, config_settings: Config = None) -> str:
    """Source distribution (maturin's hook)."""
    return str(_maturin().build_sdist(sdist_directory, config_settings))
