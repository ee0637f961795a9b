"""One of two jax processes (4 host devices each) run by test_jax_multiprocess.py: saves an
array sharded over all 8 devices (each process writes only its own shards), restores it onto
another sharding, prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

pid = int(sys.argv[1])
root = sys.argv[2]
port = sys.argv[3]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardpoint as sp  # noqa: E402
import shardpoint.jax as spj  # noqa: E402

devs = np.array(jax.devices()).reshape(4, 2)
mesh = Mesh(devs, ("x", "y"))
full = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)
sh = NamedSharding(mesh, P("x", "y"))
arr = jax.make_array_from_callback(full.shape, sh, lambda idx: full[idx])
spj.save({"w": arr, "step": 5}, f"{root}/ck")
with sp.open(f"{root}/ck") as r:
    keys = r.keys()
tgt = {
    "w": jax.ShapeDtypeStruct(full.shape, jnp.float32, sharding=NamedSharding(mesh, P("y", None))),
    "step": 0,
}
got = spj.restore(f"{root}/ck", target=tgt)
ok = all(np.array_equal(np.asarray(s.data), full[s.index]) for s in got["w"].addressable_shards)
with sp.open(f"{root}/ck") as r:
    shards = [os.path.basename(p) for p, _ in r.format_info["shards"]]
report = {"pid": pid, "keys": keys, "ok": ok, "step": got["step"], "shards": shards}
report["n_local"] = len(jax.local_devices())
print(json.dumps(report))
