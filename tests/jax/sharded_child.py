"""Run by test_jax_sharded.py in a subprocess with 8 host devices (XLA_FLAGS must be set before
jax is imported, so this cannot share a process with other jax tests). Prints one JSON line."""

from __future__ import annotations

import json
import sys

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax
import shardpoint as sp
import shardpoint.jax as spj
from shardpoint.jax import checkpoint as spj_ckpt


def main(root: str) -> None:
    assert len(jax.devices()) == 8, jax.devices()
    out: dict[str, object] = {}
    mesh8 = Mesh(np.array(jax.devices()).reshape(4, 2), ("x", "y"))
    mesh2 = Mesh(np.array(jax.devices()[:2]), ("x",))
    full = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)

    # 8 devices (4x2 mesh, both axes sharded) -> one shard per device, each an entry.
    w8 = jax.device_put(full, NamedSharding(mesh8, P("x", "y")))
    # Sharded on x only: two replicas of each shard; only replica 0 is written.
    r8 = jax.device_put(full, NamedSharding(mesh8, P("x", None)))
    rep = jax.device_put(full, NamedSharding(mesh8, P()))  # fully replicated: one entry
    tree = {"w": w8, "r": r8, "rep": rep, "step": 3}
    spj.save(tree, f"{root}/a")
    with sp.open(f"{root}/a") as r:
        keys = r.keys()
    out["w_pieces"] = sorted(k for k in keys if k.startswith("w@"))
    out["r_pieces"] = sorted(k for k in keys if k.startswith("r@"))
    out["rep_keys"] = [k for k in keys if k.startswith("rep")]

    # Restore onto 2 devices, sharded the other way (columns), logging every box read.
    reads: list[tuple[str, list[list[int]]]] = []
    real = spj_ckpt._read_box

    def logged(r, key, box, origin):  # type: ignore[no-untyped-def]
        reads.append((key, [list(b) for b in box]))
        return real(r, key, box, origin)

    spj_ckpt._read_box = logged
    target = {
        "w": jax.ShapeDtypeStruct(
            (16, 6), jnp.float32, sharding=NamedSharding(mesh2, P(None, "x"))
        ),
        "r": jax.ShapeDtypeStruct(
            (16, 6), jnp.float32, sharding=NamedSharding(mesh2, P("x", None))
        ),
        "rep": jax.ShapeDtypeStruct((16, 6), jnp.float32, sharding=NamedSharding(mesh2, P("x"))),
        "step": 0,
    }
    got = spj.restore(f"{root}/a", target=target)
    spj_ckpt._read_box = real
    out["w_equal"] = bool(np.array_equal(np.asarray(got["w"]), full))
    out["r_equal"] = bool(np.array_equal(np.asarray(got["r"]), full))
    out["rep_equal"] = bool(np.array_equal(np.asarray(got["rep"]), full))
    out["step"] = got["step"]
    out["w_sharding_ok"] = got["w"].sharding == target["w"].sharding
    out["w_device_count"] = len(got["w"].sharding.device_set)
    out["w_elements_read"] = sum(
        int(np.prod([b - a for a, b in box])) for key, box in reads if key.startswith("w@")
    )
    out["rep_elements_read"] = sum(
        int(np.prod([b - a for a, b in box])) for key, box in reads if key == "rep"
    )
    out["reads_per_w_piece"] = {}
    for key, _ in reads:
        if key.startswith("w@"):
            out["reads_per_w_piece"][key] = out["reads_per_w_piece"].get(key, 0) + 1

    # Back: 2 devices -> save -> 8 devices (4x2) restore, and no-target restore.
    spj.save({"w": got["w"]}, f"{root}/b")
    with sp.open(f"{root}/b") as r:
        out["b_pieces"] = sorted(r.keys())
    back = spj.restore(
        f"{root}/b",
        target={
            "w": jax.ShapeDtypeStruct(
                (16, 6), jnp.float32, sharding=NamedSharding(mesh8, P("x", "y"))
            )
        },
    )
    out["back_equal"] = bool(np.array_equal(np.asarray(back["w"]), full))
    out["back_shards"] = len(back["w"].addressable_shards)
    out["back_shard_shapes"] = sorted({tuple(s.data.shape) for s in back["w"].addressable_shards})
    plain = spj.restore(f"{root}/a")
    out["plain_equal"] = bool(np.array_equal(plain["w"], full) and np.array_equal(plain["r"], full))
    # A missing piece (a process's shards lost) is detected, not filled with garbage.
    spj.save({"w": w8}, f"{root}/c")
    import os

    with sp.open(f"{root}/c") as r:
        keep = {k: r[k] for k in r.keys() if k != "w@0:4,0:3"}
        meta = r.metadata
    os.remove(f"{root}/c.index")
    sp.save_file(keep, f"{root}/c", metadata=meta)
    try:
        spj.restore(f"{root}/c")
        out["missing_piece"] = "no error"
    except sp.CorruptCheckpointError as e:
        out["missing_piece"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
