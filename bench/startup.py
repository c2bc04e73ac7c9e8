"""Start-up of the vLLM runtime on the GPU machine (issue 33), measured side by side in one run.

Run on the GPU machine after ``tests/gpu/standin.sh`` (docker-up, base, payload; then
``eval "$(tests/gpu/standin.sh env)"``), as ``tests/gpu/proof.sh startup`` does::

    python bench/startup.py --out /tmp/startup [--shapes compose,k8s]

The recipe is ``recipes/qwen2-7b-h200.yaml`` built as its stand-in (tests/gpu/test_gpu_vllm_shapes)
and smoked by ``imgfab smoke --synthetic-model --shape runsh`` (time to healthy, then time to
first token of a streamed request), each start with its whole log (``--log-dir``):

1. ``capture``  (optional: to measure a row) the rendered runtime with the host's C compiler,
                empty cache, recording every Triton launcher it builds
                (tests/gpu/capture/sitecustomize.py): launchers.json, and which of them
                compat/triton_launchers.yaml lacks;
2. ``starts``   the rendered runtime (its kernels stage compiles the launchers the recipe's
                compat row lists; ``--captured``: the ones the capture recorded instead),
                less every C compiler (``-nocc``: what the rendered runtime carries; the
                stand-in base is the GPU host's own root filesystem and has them), then
   ``empty``    first start, empty cache volume;
   ``warm``     restart on the same volume;
   ``seeded``   first start on a new volume filled from the first one's caches (what a
                compile-cache artifact seeds; a phase of its own);
   and, with ``--shapes``, compose and k8s from an empty cache;
3. ``pull``     (last) cold pull to first token: push to this host's registry, remove every
                image, pull, start from an empty cache.

It prints time to healthy and to first token for each, the ratios to ``warm`` (goals: seeded
≤ 1.10, empty ≤ 1.4, warm ≤ 60 s) and, for each start, the spans between the log's landmarks,
counted from the container's start (the log's first line, which ``--log-dir`` writes): the
entrypoint's seed and probe, vLLM's imports, then the engine's own steps. ``starts`` also times
``vllm serve``'s imports in the image, and says whether they came from bytecode.
``--out`` gets startup.json (everything, logs' spans included), launchers.json and the logs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))

# The log's landmarks, in start-up order: the first line matching each (the engine's own
# timestamps, docker logs --timestamps) ends the span named after it.
# The log's first line is the container's start (imgfab smoke --log-dir writes it).
LANDMARKS = (
    ("probe reported (seed, probe)", re.compile(r"probe: exit \d")),
    ("vLLM imported, server starting", re.compile(r"vLLM API server version|non-default args")),
    ("architecture resolved", re.compile(r"Resolved architecture")),
    ("engine core started", re.compile(r"Initializing a V1 LLM engine|EngineCore.*Initializing")),
    ("model loaded", re.compile(r"Model loading took|Loading weights took")),
    ("torch.compile done", re.compile(r"torch\.compile takes|Directly load AOT|compilation took", re.I)),
    ("KV cache / warm-up", re.compile(r"GPU KV cache size|Available KV cache memory")),
    ("CUDA graphs captured", re.compile(r"Graph capturing finished|CUDA graph", re.I)),
    ("engine ready", re.compile(r"init engine .* took|Kernel JIT monitor")),
    ("serving", re.compile(r"Starting vLLM API server|Application startup complete")),
)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z ")


def spans(log: str) -> list[dict]:
    """``[{landmark, at_s, span_s}]`` from a ``--timestamps`` log: seconds from its first line."""
    times: list[tuple[datetime.datetime, str]] = []
    for line in log.splitlines():
        match = _STAMP.match(line)
        if match:
            stamp = datetime.datetime.fromisoformat(match.group(1)[:26])
            times.append((stamp, line[match.end():]))
    if not times:
        return []
    first, found, last = times[0][0], [], 0.0
    for name, pattern in LANDMARKS:
        hit = next((t for t, text in times if pattern.search(text)), None)
        if hit is None:
            continue
        at = (hit - first).total_seconds()
        if at < last:
            continue
        found.append({"landmark": name, "at_s": round(at, 1), "span_s": round(at - last, 1)})
        last = at
    return found


def smoke(image: str, shape: str, volume: str | None, logs: Path, extra: list[str] = ()) -> dict:
    from test_gpu_vllm_shapes import GPU_DEVICES, _env, _mounts

    argv = [sys.executable, "-m", "imgfab.cli", "smoke", image, "--synthetic-model", "--shape", shape,
            "--gpus", "none", "--network", "host", "--timeout", "540", "--json", "--log-dir", str(logs),
            "--env", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64", *extra]
    argv += [a for d in GPU_DEVICES if os.path.exists(d) for a in ("--device", d)]
    argv += [a for m in _mounts() for a in ("--mount", m)]
    if volume:
        argv += ["--cache-volume", volume]
    started = time.monotonic()
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    try:
        (result,) = json.loads(done.stdout)["shapes"]
    except (ValueError, KeyError):
        result = {"passed": False, "failures": [done.stdout[-1500:] + done.stderr[-1500:]]}
    log = logs / f"{shape}.log"
    text = log.read_text() if log.is_file() else ""
    return {"passed": result.get("passed"), "healthy_after_s": result.get("healthy_after_s"),
            "ttft_ms": result.get("ttft_ms"), "tokens_per_s": result.get("tokens_per_s"),
            "first_token_s": (round(result["healthy_after_s"] + result["ttft_ms"] / 1000, 2)
                              if result.get("healthy_after_s") and result.get("ttft_ms") else None),
            "failures": result.get("failures", []), "wall_s": round(time.monotonic() - started, 1),
            "spans": spans(text), "compiled_at_start": _compiles(text), "jit_monitor": _monitor(text),
            "log_tail": "" if result.get("passed") else text[-4000:]}


def _compiles(log: str) -> list[str]:
    """Lines that say something compiled at start (FlashInfer's JIT, nvcc, a C compiler)."""
    pattern = re.compile(r"Loading JIT|JIT compil|nvcc|Failed to find C compiler|MissingJITCache", re.I)
    quiet = re.compile(r"Kernel JIT monitor activated")  # the monitor arming itself, not a compile
    return [line[-300:] for line in log.splitlines() if pattern.search(line) and not quiet.search(line)][:20]


def _monitor(log: str) -> str:
    """The JIT monitor's mode as the engine armed it ("" when the log does not say)."""
    found = re.search(r"Kernel JIT monitor activated.*?mode=(\w+)", log)
    return found.group(1) if found else ""


def docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    from test_gpu_vllm_shapes import _env

    return subprocess.run(["docker", *argv], env=_env(), capture_output=True, text=True, check=check)


def fresh_volume(name: str) -> str:
    docker("volume", "rm", "-f", name, check=False)
    docker("volume", "create", name)
    return name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="startup.json, launchers.json and the logs")
    parser.add_argument("--phase", default="all",
                        help="capture, starts, seeded, shapes, pull (last: it removes every image), or several "
                             "joined by commas (a device call runs "
                             "10 minutes at most); all: starts,seeded,shapes")
    parser.add_argument("--shapes", default="compose,k8s", help="the shapes phase: these from an empty cache")
    parser.add_argument("--captured", action="store_true",
                        help="starts: build with the launchers the capture phase recorded, not the rendered ones")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "startup.json"
    result: dict = json.loads(saved.read_text()) if saved.is_file() else {}

    def save() -> None:
        saved.write_text(json.dumps(result, indent=1) + "\n")

    phases = ("starts", "seeded", "shapes") if args.phase == "all" else tuple(args.phase.split(","))
    known = ("capture", "starts", "seeded", "shapes", "pull")
    if not set(phases) <= set(known):
        parser.error(f"--phase: {args.phase!r}: each is one of {', '.join(known)}")
    for phase in phases:
        {"capture": capture_phase, "starts": starts_phase, "seeded": seeded_phase,
         "shapes": shapes_phase, "pull": pull_phase}[phase](result, out, save, args)
        save()
    report(result)
    save()
    return 0 if all(result.get(k, {}).get("passed") for k in ("empty", "warm", "seeded")) else 1


WORK = Path(os.environ.get("IMGFAB_STANDIN", "/tmp/imgfab-standin")) / "startup"
AFTER_NOCC = "imgfab-proof/qwen2-7b-h200:standin-seeded-nocc"


def capture_phase(result: dict, out: Path, save, args) -> None:
    from test_gpu_vllm_shapes import IMAGE, build_standin

    result["machine"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    subprocess.run(["rm", "-rf", str(WORK)], check=True)
    started = time.monotonic()
    built = build_standin(WORK / "a" / "ctx", IMAGE)
    result["build_before"] = {"kernels": built["kernels"], "seconds": round(time.monotonic() - started, 1)}
    save()
    capture = WORK / "capture"
    capture.mkdir(parents=True)
    capture.chmod(0o777)
    (capture / "sitecustomize.py").write_text((REPO / "tests" / "gpu" / "capture" / "sitecustomize.py").read_text())
    result["capture"] = smoke(IMAGE, "runsh", fresh_volume("imgfab-startup-capture"), out / "capture", [
        "--mount", f"{capture}:/imgfab-capture", "--env", "PYTHONPATH=/imgfab-capture:/opt/imgfab",
        "--env", "IMGFAB_CAPTURE_LAUNCHERS=/imgfab-capture/launchers.jsonl"])
    seen: dict[str, dict] = {}
    lines = (capture / "launchers.jsonl").read_text().splitlines() if (capture / "launchers.jsonl").is_file() else []
    for line in lines:
        record = json.loads(line)
        seen.setdefault(record["key"], record)
    launchers = {"launchers": sorted(seen.values(), key=lambda r: r["key"])}
    (out / "launchers.json").write_text(json.dumps(launchers, indent=1, sort_keys=True) + "\n")
    committed = json.loads((WORK / "a" / "ctx" / "imgfab-triton-launchers.json").read_text())["launchers"]
    result["launchers"] = {"built_at_start": len(lines), "distinct": len(seen),
                           "missing_from_compat": sorted(set(seen) - {r["key"] for r in committed})}
    print(f"capture: {result['capture']['passed']} healthy {result['capture']['healthy_after_s']} s; "
          f"{len(lines)} launcher builds, {len(seen)} distinct", flush=True)


def starts_phase(result: dict, out: Path, save, args) -> None:
    from test_gpu_vllm_shapes import IMAGE, build_standin, nocc_variant

    # the launchers the recipe renders (compat/triton_launchers.yaml), or with --captured the
    # ones this run's capture phase recorded
    launchers = json.loads((out / "launchers.json").read_text()) if args.captured else None
    started = time.monotonic()
    built = build_standin(WORK / "b" / "ctx", f"{IMAGE}-seeded", launchers)
    rendered = json.loads((WORK / "b" / "ctx" / "imgfab-triton-launchers.json").read_text())
    result["launchers_built"] = {"from": "captured" if args.captured else "compat/triton_launchers.yaml",
                                 "count": len(rendered["launchers"])}
    result["build_after"] = {"kernels": built["kernels"], "seconds": round(time.monotonic() - started, 1)}
    image = nocc_variant(f"{IMAGE}-seeded")
    assert image == AFTER_NOCC, image
    result["imports"] = import_seconds(image)
    save()
    print(f"imports: {result['imports']}", flush=True)
    for name, volume in (("empty", fresh_volume("imgfab-startup-v1")), ("warm", "imgfab-startup-v1")):
        result[name] = smoke(image, "runsh", volume, out / name)
        save()
        print(f"{name}: {result[name]['passed']} healthy {result[name]['healthy_after_s']} s", flush=True)


# What `vllm serve` imports before its first line, timed in the image twice (the second with
# the page cache warm), and whether it came from bytecode (the image's user cannot write any).
_IMPORTS = ("import sys, time; t = time.perf_counter(); import vllm.entrypoints.cli.main; "
            "import vllm, os; print(round(time.perf_counter() - t, 2), os.path.isfile(vllm.__cached__))")


def import_seconds(image: str) -> dict:
    from test_gpu_vllm_shapes import _mounts

    runs = []
    for _ in range(2):
        done = docker("run", "--rm", "--network", "none", *[a for m in _mounts() for a in ("-v", m)],
                      "--entrypoint", "/opt/venv/bin/python3", image, "-c", _IMPORTS, check=False)
        words = done.stdout.split()
        runs.append({"seconds": float(words[0]), "bytecode": words[1] == "True"} if done.returncode == 0 and
                    len(words) == 2 else {"error": done.stderr[-500:]})
    return {"vllm_cli": runs}


def seeded_phase(result: dict, out: Path, save, args) -> None:
    image = AFTER_NOCC
    fresh_volume("imgfab-startup-v2")
    copied = docker("run", "--rm", "--user", "0", "-v", "imgfab-startup-v1:/from:ro", "-v", "imgfab-startup-v2:/to",
                    "--entrypoint", "/bin/bash", image, "-c", "cp -a /from/. /to/ && du -sb /to", check=False)
    result["seed_bytes"] = copied.stdout.split()[0] if copied.returncode == 0 else copied.stderr[-500:]
    result["seeded"] = smoke(image, "runsh", "imgfab-startup-v2", out / "seeded")
    print(f"seeded: {result['seeded']['passed']} healthy {result['seeded']['healthy_after_s']} s", flush=True)


def shapes_phase(result: dict, out: Path, save, args) -> None:
    for shape in [s for s in args.shapes.split(",") if s]:
        volume = fresh_volume(f"imgfab-startup-{shape}") if shape == "compose" else None
        result[f"empty-{shape}"] = smoke(AFTER_NOCC, shape, volume, out / f"empty-{shape}")
        save()
        print(f"empty {shape}: {result[f'empty-{shape}']['passed']} healthy "
              f"{result[f'empty-{shape}']['healthy_after_s']} s", flush=True)


def pull_phase(result: dict, out: Path, save, args) -> None:
    """Cold pull to first token: the nocc runtime pushed to the registry on this host
    (tests/gpu/standin.sh registry), every image removed from the engine (the stand-in base
    too, so no layer is already there), then pulled, and started from an empty cache. The
    stand-in's base is this host's root filesystem, far larger than nvidia/cuda's -base, so
    the pull's share is this stand-in's, not the real image's."""
    registry = os.environ.get("IMGFAB_STANDIN_REGISTRY") or "127.0.0.1:5099"
    remote = f"{registry}/imgfab-proof/qwen2-7b-h200:cold"
    docker("tag", AFTER_NOCC, remote)
    started = time.monotonic()
    docker("push", remote)
    pushed = round(time.monotonic() - started, 1)
    size = docker("image", "inspect", "--format", "{{.Size}}", remote).stdout.strip()
    listed = docker("image", "ls", "-q").stdout.split()
    docker("image", "rm", "-f", *sorted(set(listed)), check=False)
    docker("image", "prune", "-af", check=False)
    left = docker("image", "ls", "-q").stdout.split()
    started = time.monotonic()
    docker("pull", remote)
    pulled = round(time.monotonic() - started, 1)
    start = smoke(remote, "runsh", fresh_volume("imgfab-startup-cold"), out / "cold")
    result["cold_pull"] = {"image_bytes": int(size) if size.isdigit() else size, "push_s": pushed,
                           "images_left_before_pull": len(left), "pull_s": pulled, "start": start,
                           "pull_to_first_token_s": start["first_token_s"] and round(pulled + start["first_token_s"], 1)}
    print(f"cold pull: {pulled} s for {size} bytes, then healthy {start['healthy_after_s']} s, first token "
          f"{start['first_token_s']} s: {result['cold_pull']['pull_to_first_token_s']} s", flush=True)


def report(result: dict) -> None:
    warm = (result.get("warm") or {}).get("healthy_after_s")
    for name in ("capture", "empty", "warm", "seeded", "empty-compose", "empty-k8s"):
        run = result.get(name)
        if not run:
            continue
        ratio = f", ÷ warm {run['healthy_after_s'] / warm:.2f}" if warm and run.get("healthy_after_s") else ""
        print(f"{name:14} passed={run['passed']} healthy {run['healthy_after_s']} s, first token "
              f"{run['first_token_s']} s{ratio}")
        for span in run["spans"]:
            print(f"    {span['span_s']:7.1f} s  -> {span['landmark']} (at {span['at_s']} s)")
    if warm and "seeded" in result:
        seeded, empty = result["seeded"].get("healthy_after_s"), result["empty"].get("healthy_after_s")
        result["ratios"] = {"seeded_over_warm": seeded and round(seeded / warm, 3),
                            "empty_over_warm": empty and round(empty / warm, 3), "warm_s": warm}
        print(f"seeded/warm {result['ratios']['seeded_over_warm']} (goal <= 1.10), empty/warm "
              f"{result['ratios']['empty_over_warm']} (goal <= 1.4), warm {warm} s (goal <= 60)")


if __name__ == "__main__":
    sys.exit(main())
