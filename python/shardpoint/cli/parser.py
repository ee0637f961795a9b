"""The command line's parser, in one place: every command's flags and the function it runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from .common import EXIT_USAGE, _Fail
from .convert_gc import cmd_convert, cmd_gc
from .diff import cmd_diff
from .export import cmd_export
from .ls_info import cmd_info, cmd_ls
from .stats_view import cmd_stats, cmd_view
from .verify_sign import cmd_sign, cmd_verify

EPILOG = """\
exit status:
  0  success (verify: intact; diff: identical; stats: every value finite)
  1  damaged or corrupt checkpoint; diff: the checkpoints differ
  2  usage error: bad arguments, unsupported format or dtype, destination exists;
     stats: a tensor holds NaN/Inf (unless --no-fail)
  3  not found: the checkpoint, file or directory does not exist
  4  I/O error: the operating system refused a read or write
  70 internal error (a bug in shardpoint: please report it with the traceback)

Progress bars are drawn on stderr when it is a terminal (needs tqdm); see --progress.

Object stores: every PREFIX may be a URL (s3://bucket/run/ckpt-7, gs://, az://; s3://bucket/dir/
with a trailing slash is a manager directory). Credentials and endpoint come from the usual
environment (AWS_*, AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, AZURE_*).
"""


# --- parsing and the error edge --------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _Fail(message, EXIT_USAGE)


def _progress_flags(p: argparse.ArgumentParser, default: Any) -> None:
    bars = p.add_mutually_exclusive_group()
    bars.add_argument(
        "--progress", dest="progress", action="store_const", const=True, default=default,
        help="always draw progress bars on stderr (default: only when stderr is a terminal)",
    )  # fmt: skip
    bars.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, default=default,
        help="never draw progress bars",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardpoint",
        description="Inspect, verify, compare and convert checkpoints.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    p.add_argument("--version", action="version", version=f"shardpoint {__version__}")
    _progress_flags(p, default=None)
    # The same flags after the command name (`shardpoint convert --progress ...`) too.
    common = _Parser(add_help=False)
    _progress_flags(common, default=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    ls = sub.add_parser(
        "ls",
        parents=[common],
        help="list keys (or a directory's checkpoints)",
        description="List the keys of a checkpoint with dtype, shape, sizes, codec and ratio, or the checkpoints of a CheckpointManager directory.",
    )
    ls.add_argument(
        "path", metavar="PREFIX", help="checkpoint prefix, .safetensors/.pt file, or directory"
    )
    ls.add_argument("--prefix", metavar="KEYPREFIX", help="only keys starting with KEYPREFIX")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_ls)

    info = sub.add_parser(
        "info",
        parents=[common],
        help="format, shards, metadata and object graph",
        description="Show format version, shards, writer metadata and the object-graph summary. A directory means its latest checkpoint.",
    )
    info.add_argument("path", metavar="PREFIX")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=cmd_info)

    ver = sub.add_parser(
        "verify",
        parents=[common],
        help="check every checksum (exit 1 when damaged)",
        description="Check every checksum and structural invariant in parallel. Exit 0 when intact, 1 with the damaged file, key and offset named otherwise.",
    )
    ver.add_argument("path", metavar="PREFIX")
    ver.add_argument(
        "--strong",
        action="store_true",
        help="also re-hash every file against the digest manifest recorded at save time "
        "(save with digest=...); prints the root digest (exit 1 if none was recorded)",
    )
    ver.add_argument(
        "--expect",
        metavar="ROOT",
        help="with --strong: the root digest (sha256:HEX / blake3:HEX) the checkpoint must have",
    )
    ver.add_argument(
        "--signature",
        nargs="?",
        const="",
        metavar="SIG",
        help="also check the model_signing signature SIG (default P.sig, DIR.sig); exit 1 if "
        "absent or not matching",
    )
    ver.add_argument("--public-key", metavar="PEM", help="--signature: the signer's public key")
    ver.add_argument(
        "--certificate-chain",
        metavar="PEM",
        action="append",
        help="--signature: certificates that issued the signing certificate (repeatable)",
    )
    ver.set_defaults(func=cmd_verify)

    sg = sub.add_parser(
        "sign",
        parents=[common],
        help="sign a checkpoint or model directory (model_signing, local keys)",
        description="Sign a checkpoint prefix (a manager directory: its latest checkpoint) or a Hugging Face model directory with the OpenSSF model_signing library, using a local private key (or a signing certificate). The signature verifies with `model_signing verify key` too. Needs shardpoint[signing].",
    )
    sg.add_argument("path", metavar="PREFIX")
    sg.add_argument(
        "--private-key", required=True, metavar="PEM", help="elliptic-curve private key"
    )
    sg.add_argument("--signature", metavar="SIG", help="output (default P.sig, DIR.sig)")
    sg.add_argument("--certificate", metavar="PEM", help="sign with this certificate of the key")
    sg.add_argument(
        "--certificate-chain", metavar="PEM", action="append", help="issuers of --certificate"
    )
    sg.add_argument(
        "--password-env", metavar="VAR", help="environment variable holding the key's password"
    )
    sg.set_defaults(func=cmd_sign)

    d = sub.add_parser(
        "diff",
        parents=[common],
        help="compare two checkpoints (exit 1 when they differ)",
        description="Keys only in A or B, changed dtype/shape, and the max |a-b| of differing tensors. Any readable format on either side.",
    )
    d.add_argument("a", metavar="A")
    d.add_argument("b", metavar="B")
    d.add_argument(
        "--atol",
        type=float,
        default=0.0,
        help="tensors whose max |a-b| <= ATOL count as equal (default 0: exact)",
    )
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument(
        "--values",
        action="store_true",
        help="per common tensor: relative L2 change, max |a-b|, bit-identical or not (equal "
        "crc32c: not read), sorted by change",
    )
    d.add_argument("--keys", metavar="GLOB", help="--values: only keys matching GLOB")
    d.set_defaults(func=cmd_diff)

    st = sub.add_parser(
        "stats",
        parents=[common],
        help="per-tensor min/max/mean/std, NaN/Inf/zero counts, L2 (exit 2 on NaN/Inf)",
        description="Numerical health of every tensor, computed in one parallel pass with the decode (values checksum-checked). Exit 2 when a tensor holds NaN or Inf, unless --no-fail.",
    )
    st.add_argument("path", metavar="PREFIX", help="checkpoint, HF directory or any readable file")
    st.add_argument("--keys", metavar="GLOB", help="only keys matching GLOB (fnmatch; * crosses /)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--no-fail", action="store_true", help="exit 0 even when NaN/Inf are found")
    st.set_defaults(func=cmd_stats)

    vw = sub.add_parser(
        "view",
        parents=[common],
        help="write a self-contained HTML page to browse a checkpoint (and its change vs B)",
        description="Write one self-contained, offline HTML file: the key tree with shapes, dtypes, sizes and ratios, parameters per dtype, a treemap of bytes, health statistics (NaN/Inf flagged) and, with B, the change per layer. Nothing is served.",
    )
    vw.add_argument("path", metavar="PREFIX")
    vw.add_argument("other", metavar="B", nargs="?", help="a second checkpoint to compare with")
    vw.add_argument("-o", "--output", metavar="HTML", help="output file (default ./NAME.view.html)")
    vw.add_argument(
        "--stats",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compute health statistics into the page (default: when the checkpoint is under 4 GiB)",
    )
    vw.add_argument("--open", action="store_true", help="open the page in a browser")
    vw.set_defaults(func=cmd_view)

    c = sub.add_parser(
        "convert",
        parents=[common],
        help="convert between formats",
        description="Convert SRC (shardpoint prefix, .safetensors, PyTorch .pt/.bin, TensorFlow checkpoint prefix, Hugging Face model directory) into DST: a shardpoint prefix, a .safetensors file, or (--to hf) a Hugging Face directory.",
    )
    c.add_argument("src", metavar="SRC")
    c.add_argument("dst", metavar="DST")
    c.add_argument(
        "--to",
        choices=["shardpoint", "safetensors", "hf"],
        help="destination format (default: from DST's suffix)",
    )
    c.add_argument(
        "--compression",
        default="zstd",
        choices=["zstd", "zstd-plain", "zstd-bytegroup", "bytegroup-huffman", "none"],
        help="for shardpoint destinations (default zstd)",
    )
    c.add_argument("--level", type=int, help="zstd level (-7..22)")
    c.add_argument(
        "--shards", type=int, help="shard files / writer threads (default: one per 256 MiB)"
    )
    c.add_argument(
        "--max-shard-size",
        default="5GB",
        metavar="SIZE",
        help="--to hf: largest shard, e.g. 5GB, 500MB (decimal units; default 5GB)",
    )
    c.add_argument(
        "--base",
        metavar="BASE",
        help="store DST as a delta checkpoint against shardpoint checkpoint BASE (a fine-tune "
        "against its base model: each tensor same, XOR or whole, whichever is smallest; "
        "DST then needs BASE to be read; docs/DELTA.md)",
    )
    c.add_argument("--force", action="store_true", help="replace an existing destination")
    c.add_argument("--no-fsync", action="store_true", help="skip fsync (scratch conversions)")
    c.set_defaults(func=cmd_convert)

    e = sub.add_parser(
        "export",
        parents=[common],
        help="write a serving directory (vLLM, SGLang, transformers)",
        description="Write DIR for serving from SRC (a Hugging Face model directory, or a shardpoint checkpoint converted from one): config.json (with dtype) and tokenizer files, and the weights as DIR/model (vllm serve DIR --load-format shardpoint) or, with --tp N, one checkpoint per tensor-parallel rank holding only that rank's part of each weight (--load-format shardpoint_sharded).",
    )
    e.add_argument("src", metavar="SRC")
    e.add_argument("dst", metavar="DIR")
    e.add_argument(
        "--tp", type=int, metavar="N", help="cut the weights for N tensor-parallel ranks"
    )
    e.add_argument(
        "--compression",
        default="zstd",
        choices=["zstd", "zstd-plain", "zstd-bytegroup", "bytegroup-huffman", "none"],
        help="codec of the weights (default zstd)",
    )
    e.add_argument("--level", type=int, help="zstd level (-7..22)")
    e.add_argument("--force", action="store_true", help="replace an existing DIR")
    e.add_argument("--no-fsync", action="store_true", help="skip fsync (scratch exports)")
    e.set_defaults(func=cmd_export)

    g = sub.add_parser(
        "gc",
        parents=[common],
        help="remove what dead saves left under a URL or DIR; with --keep-last, old checkpoints",
        description="Remove what writers killed mid-save left under an object-store URL or a "
        "local directory: incomplete multipart uploads (found through their .upload marker "
        "objects) and the markers, partial indexes, shards no index references, abandoned temp "
        "files. In a local DIR with --keep-last N, first delete the checkpoints that are neither "
        "kept (the N newest, and those a CheckpointManager state file lists) nor a base that a "
        "kept delta checkpoint's chain needs.",
    )
    g.add_argument("url", metavar="URL|DIR", help="s3://bucket/dir, or a local directory")
    g.add_argument(
        "--older-than",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="only uploads/checkpoints at least this old (default 3600: spares live saves)",
    )
    g.add_argument(
        "--keep-last",
        type=int,
        metavar="N",
        help="DIR: keep the N newest checkpoints, those a manager state file lists, and their "
        "delta bases; delete the other checkpoints",
    )
    g.add_argument("--dry-run", action="store_true", help="DIR: list what would be deleted")
    g.set_defaults(func=cmd_gc)
    return p
