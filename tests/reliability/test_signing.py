"""Signing checkpoints through OpenSSF ``model_signing`` with local keys (``shardpoint sign`` /
``shardpoint verify --signature``): what a signature catches that crc32c cannot (a value
rewritten with its crc recomputed), unsigned checkpoints, wrong keys, manager directories,
Hugging Face directories, and interoperability with ``model_signing``'s own CLI both ways."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import shardpoint as sp
from reliability_helpers.tamper import rewrite_raw_value
from shardpoint.cli import EXIT_DAMAGED, EXIT_OK, main
from shardpoint.errors import DigestMismatchError, SignatureError, SignatureMissingError

pytest.importorskip("model_signing")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from safetensors.numpy import save_file as st_save  # noqa: E402

from shardpoint import signing  # noqa: E402


def _keypair(d, name: str) -> tuple[str, str]:
    k = ec.generate_private_key(ec.SECP256R1())
    priv, pub = str(d / f"{name}.pem"), str(d / f"{name}.pub.pem")
    with open(priv, "wb") as f:
        f.write(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    with open(pub, "wb") as f:
        f.write(
            k.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return priv, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[str, str]:
    return _keypair(tmp_path_factory.mktemp("keys"), "signer")


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


def _their_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``model_signing``'s own command line, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "model_signing", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def _save(prefix: str) -> dict[str, np.ndarray]:
    vals = {"w": np.arange(4096, dtype=np.float32), "b": np.arange(64, dtype=np.int64)}
    sp.save_file(vals, prefix, compression="none", shards=2, digest="sha256")
    return vals


def test_signature_catches_a_value_rewritten_with_its_crc(tmp_path, keys, capsys):
    priv, pub = keys
    p = str(tmp_path / "ck")
    vals = _save(p)
    sp.save_file({"x": np.ones(3)}, str(tmp_path / "neighbour"))  # another checkpoint beside it
    status, out, _ = _cli(capsys, "sign", p, "--private-key", priv)
    assert status == EXIT_OK and "ck.sig" in out
    status, out, _ = _cli(capsys, "verify", p, "--signature", "--public-key", pub)
    assert status == EXIT_OK and "signature OK: 3 files" in out
    # model_signing's own CLI verifies our signature (the directory holds other files too)
    r = _their_cli(
        "verify", "key", str(tmp_path), "--signature", p + ".sig",
        "--public_key", pub, "--ignore_unsigned_files",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Verification succeeded" in r.stdout + r.stderr
    # an attacker changes one value and fixes its crc32c: every crc check still passes ...
    evil = vals["b"].copy()
    evil[5] = 123456789
    shard = rewrite_raw_value(p, "b", evil.tobytes())
    with sp.open(p) as rd:
        rd.verify()
        assert int(rd["b"][5]) == 123456789
        with pytest.raises(DigestMismatchError):  # ... the digest manifest does not
            rd.verify(strong=True)
    # ... and neither does the signature, naming the file
    with pytest.raises(SignatureError, match=os.path.basename(shard)):
        signing.verify_signature(p, public_key=pub)
    status, _, err = _cli(capsys, "verify", p, "--signature", "--public-key", pub)
    assert status == EXIT_DAMAGED and "does not verify" in err


def test_unsigned_and_wrong_key_say_so(tmp_path, keys, capsys):
    priv, pub = keys
    p = str(tmp_path / "ck")
    _save(p)
    with pytest.raises(SignatureMissingError, match="not signed"):
        signing.verify_signature(p, public_key=pub)
    status, _, err = _cli(capsys, "verify", p, "--signature", "--public-key", pub)
    assert status == EXIT_DAMAGED and "not signed" in err
    signing.sign(p, private_key=priv)
    _, other_pub = _keypair(tmp_path, "other")
    with pytest.raises(SignatureError, match="does not verify"):
        signing.verify_signature(p, public_key=other_pub)
    # a signature of other files does not vouch for this checkpoint
    q = str(tmp_path / "q")
    _save(q)
    with pytest.raises(SignatureError, match="does not cover"):
        signing.verify_signature(q, public_key=pub, signature=p + ".sig")


def test_hashed_checkpoint_signs_its_index_and_hashed_shards(tmp_path, keys):
    """``P/`` of a hashed checkpoint (FORMAT.md §3.1.1) is a directory, yet the checkpoint is
    what is signed: ``P.index`` and ``P/HH/data-…``, not the user's file beside them."""
    priv, pub = keys
    p = str(tmp_path / "ck")
    sp.save_file(
        {"w": np.arange(4096.0), "b": np.arange(9)}, p, shards=2, compression="none",
        hashed_prefixes=True,
    )  # fmt: skip
    (tmp_path / "ck" / "notes.txt").write_text("a user's file, not signed")
    signing.sign(p, private_key=priv)
    names = signing.verify_signature(p, public_key=pub)
    with sp.open(p) as r:
        shards = [os.path.relpath(s, tmp_path) for s, _ in r.format_info["shards"]]
    assert names == sorted(["ck.index", *shards]) and all(s.startswith("ck/") for s in shards)
    (tmp_path / "ck" / "notes.txt").write_text("changed: not the checkpoint's")
    signing.verify_signature(p, public_key=pub)
    evil = np.arange(9)
    evil[3] = 99  # a value rewritten with its crc fixed, in a hashed shard
    shard = rewrite_raw_value(p, "b", evil.tobytes())
    with pytest.raises(SignatureError, match=os.path.basename(shard)):
        signing.verify_signature(p, public_key=pub)


def test_manager_directory_signs_its_latest_checkpoint(tmp_path, keys):
    priv, pub = keys
    d = str(tmp_path / "run")
    ckpt = sp.Checkpoint(v=sp.Variable(np.arange(8.0)))
    mgr = sp.CheckpointManager(ckpt, d, max_to_keep=3)
    mgr.save()
    latest = mgr.save()
    sig = signing.sign(d, private_key=priv)
    assert str(sig) == latest + ".sig"
    assert signing.verify_signature(d, public_key=pub) == sorted(
        signing.target_of(latest).checkpoint_files
    )
    mgr.save()  # the directory changes beside the signed checkpoint
    signing.verify_signature(latest, public_key=pub)
    with pytest.raises(SignatureMissingError):  # the new latest is not signed
        signing.verify_signature(d, public_key=pub)


def test_hugging_face_directory_signed_by_their_cli_verifies_with_ours(tmp_path, keys, capsys):
    priv, pub = keys
    hf = tmp_path / "model"
    hf.mkdir()
    st_save({"w": np.ones((4, 4), np.float32)}, str(hf / "model.safetensors"))
    (hf / "config.json").write_text('{"model_type": "tiny"}')
    r = _their_cli(
        "sign", "key", str(hf), "--signature", str(tmp_path / "model.sig"), "--private_key", priv
    )
    assert r.returncode == 0, r.stderr
    status, out, _ = _cli(capsys, "verify", str(hf), "--signature", "--public-key", pub)
    assert status == EXIT_OK and "signature OK: 2 files" in out
    # our signature of the same directory, and a changed file
    ours = tmp_path / "ours.sig"
    signing.sign(str(hf), private_key=priv, signature=str(ours))
    signing.verify_signature(str(hf), public_key=pub, signature=str(ours))
    (hf / "config.json").write_text('{"model_type": "evil"}')
    for sig in (tmp_path / "model.sig", ours):
        with pytest.raises(SignatureError, match="config.json"):
            signing.verify_signature(str(hf), public_key=pub, signature=str(sig))


def test_checkpoint_signed_by_their_cli_verifies_with_ours(tmp_path, keys):
    """Their CLI signs a directory holding one checkpoint; ours checks the prefix in it."""
    priv, pub = keys
    d = tmp_path / "only"
    d.mkdir()
    p = str(d / "ck")
    vals = _save(p)
    r = _their_cli(
        "sign", "key", str(d), "--signature", str(tmp_path / "dir.sig"), "--private_key", priv
    )
    assert r.returncode == 0, r.stderr
    names = signing.verify_signature(p, public_key=pub, signature=str(tmp_path / "dir.sig"))
    assert "ck.index" in names
    rewrite_raw_value(p, "w", (vals["w"] + 1).tobytes())
    with pytest.raises(SignatureError):
        signing.verify_signature(p, public_key=pub, signature=str(tmp_path / "dir.sig"))


def _certificates(d, key_pem: str) -> tuple[str, str, str]:
    """A CA, a signing certificate of ``key_pem`` issued by it, and an unrelated CA."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    with open(key_pem, "rb") as f:
        leaf_key = serialization.load_pem_private_key(f.read(), password=None)
    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, issuer: str, pub, signer, ca: bool) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(pub)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=not ca,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=ca,
                    crl_sign=ca,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
        )
        return b.sign(signer, hashes.SHA256())

    paths = []
    ca_key = ec.generate_private_key(ec.SECP256R1())
    other_key = ec.generate_private_key(ec.SECP256R1())
    for name, c in (
        ("ca", cert("test CA", "test CA", ca_key.public_key(), ca_key, True)),
        ("leaf", cert("signer", "test CA", leaf_key.public_key(), ca_key, False)),
        ("other_ca", cert("other", "other", other_key.public_key(), other_key, True)),
    ):
        path = str(d / f"{name}.crt.pem")
        with open(path, "wb") as f:
            f.write(c.public_bytes(serialization.Encoding.PEM))
        paths.append(path)
    return paths[0], paths[1], paths[2]


def test_certificate_signing_verifies_against_its_issuer_only(tmp_path, keys, capsys):
    priv, _ = keys
    ca, leaf, other_ca = _certificates(tmp_path, priv)
    p = str(tmp_path / "ck")
    _save(p)
    status, _, err = _cli(
        capsys, "sign", p, "--private-key", priv, "--certificate", leaf, "--certificate-chain", ca
    )
    assert status == EXIT_OK, err
    status, out, err = _cli(capsys, "verify", p, "--signature", "--certificate-chain", ca)
    assert status == EXIT_OK and "signature OK" in out, err
    with pytest.raises(SignatureError, match="does not verify"):
        signing.verify_signature(p, certificate_chain=[other_ca])
