"""The multi-node leader's wait: until every node and GPU of the replica has joined its Ray
cluster, bounded, before ``vllm serve`` starts (``target.nodes`` > 1).

Run by the entrypoint of the leader (``IMGFAB_ROLE=leader``) after ``ray start --head``, as
``python -m imgfab.in_image.cluster --nodes N --gpus G [--timeout S]``. Exit 0 when the cluster
has at least N live nodes and G GPUs; exit 1 with one line naming what joined and what to do
when the bound passes first. Standard library only at import time: ``ray`` (in the vLLM payload)
is imported only when the cluster is asked, and tests pass recorded answers instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 600.0
POLL_S = 2.0

# (live nodes, GPUs they declare); raises when the cluster cannot be asked (yet).
Census = Callable[[], "tuple[int, float]"]


def ray_census(address: str = "auto") -> Census:
    """A census over ``ray``: the live nodes of ``ray.nodes()`` and the GPUs they declare."""
    def census() -> tuple[int, float]:
        import ray  # noqa: PLC0415 - the payload's, imported only on a leader

        if not ray.is_initialized():
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        return len(alive), sum(float(n.get("Resources", {}).get("GPU", 0)) for n in alive)
    return census


def wait_for_cluster(census: Census, *, nodes: int, gpus: int, timeout_s: float = DEFAULT_TIMEOUT_S,
                     poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    """Poll ``census`` until ``nodes`` nodes with ``gpus`` GPUs have joined, or ``timeout_s``
    has passed: (True, what joined) or (False, the one line saying what is missing)."""
    start = clock()
    seen, gpu_seen, error = 0, 0.0, ""
    while True:
        try:
            seen, gpu_seen = census()
            error = ""
        except Exception as exc:  # the head not up yet, a transient GCS error
            error = f" (last error: {type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
        if not error and seen >= nodes and gpu_seen >= gpus:
            return True, f"{seen} node(s) with {gpu_seen:g} GPU(s) joined the Ray cluster"
        if clock() - start >= timeout_s:
            return False, (f"imgfab: {seen} of {nodes} node(s) ({gpu_seen:g} of {gpus} GPUs) joined "
                           f"the Ray cluster within {timeout_s:g} s{error}; start the workers "
                           f"(IMGFAB_ROLE=worker, IMGFAB_LEADER_ADDRESS=this leader) or raise "
                           f"IMGFAB_RAY_WAIT_S")
        sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="imgfab-cluster-wait",
                                     description="Wait until the Ray cluster has N nodes and G GPUs.")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--address", default="auto")
    args = parser.parse_args(argv)
    ok, line = wait_for_cluster(ray_census(args.address), nodes=args.nodes, gpus=args.gpus,
                                timeout_s=args.timeout)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
