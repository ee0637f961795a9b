"""The command line's entry point and its error edge: expected failures print one line and exit
with their documented status; only a bug in shardpoint prints a traceback."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from ..errors import (
    CheckpointError,
    CheckpointIOError,
    CorruptCheckpointError,
    InvalidArgumentError,
    InvalidKeyError,
    MissingKeyError,
    NotFoundError,
    UnsupportedDTypeError,
)
from .common import EXIT_DAMAGED, EXIT_INTERNAL, EXIT_IO, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, _Fail
from .parser import build_parser


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, (NotFoundError, FileNotFoundError)):
        return EXIT_NOT_FOUND
    if isinstance(exc, CorruptCheckpointError):
        return EXIT_DAMAGED
    if isinstance(
        exc, (InvalidArgumentError, UnsupportedDTypeError, InvalidKeyError, MissingKeyError)
    ):
        return EXIT_USAGE
    if isinstance(exc, (CheckpointIOError, OSError)):
        return EXIT_IO
    return EXIT_DAMAGED  # any other CheckpointError is a problem with the checkpoint itself


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, CheckpointError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (the console script exits with it)."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except _Fail as e:
        sys.stderr.write(f"shardpoint: error: {e}\n")
        return e.status
    except KeyboardInterrupt:
        sys.stderr.write("shardpoint: interrupted\n")
        return 130
    except BrokenPipeError:
        # `shardpoint ls big | head`: the reader went away; not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (CheckpointError, OSError) as e:
        sys.stderr.write(f"shardpoint: error: {_message(e)}\n")
        return _status_of(e)
    except Exception:
        traceback.print_exc()
        sys.stderr.write("shardpoint: internal error (a bug in shardpoint; please report it)\n")
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
