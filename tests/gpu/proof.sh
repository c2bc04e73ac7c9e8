#!/bin/bash
# The H200 proof of issue 16, step by step on the GPU machine (the device tool): each step is
# one call, the payload travelling in pieces of at most 60 MiB (.gpu/, git-ignored, carried).
#   tests/gpu/proof.sh setup          # host facts; dockerd up; the stand-in base, in the background
#   tests/gpu/proof.sh piece FILE...  # keep payload pieces in /tmp/imgfab-pieces
#   tests/gpu/proof.sh assemble       # the payload from its pieces, with its bytecode (else the
#                                     # first shape or startup call does it)
#   tests/gpu/proof.sh shape SHAPE    # (first call: assemble the payload) smoke one run shape
#                                     # (runsh|compose|k8s; nocc: run.sh with no C compiler in the image)
#   tests/gpu/proof.sh startup PHASE  # bench/startup.py: capture, starts, seeded, shapes, pull (a call each)
#   tests/gpu/proof.sh select         # (after a shape built the stand-in) select with no --gpu
# Results go to $OUT (the device tool's folder), one JSON per step.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/imgfab-proof-out}
PIECES=/tmp/imgfab-pieces
STATE=${IMGFAB_STANDIN:-/tmp/imgfab-standin}
mkdir -p "$OUT" "$PIECES" "$STATE"

case "${1:-}" in
setup)
    shift
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], sys.prefix, sys.base_prefix, "torch", torch.__version__)'
    for tool in gcc g++ ninja; do command -v "$tool" || echo "no $tool on the host"; done
    ls /usr/include/python3.12/Python.h || true
    df -h /tmp | tail -n 1
    # What -devel would add: the host's own CUDA toolkit tree; and what NVML names this GPU.
    du -sh /usr/local/cuda-* 2>/dev/null | tee "$OUT/cuda-toolkit-du.txt" || true
    python3 -c 'import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); print("nvml:", n.nvmlDeviceGetName(h), n.nvmlDeviceGetMemoryInfo(h).total, n.nvmlSystemGetDriverVersion())' | tee "$OUT/nvml.txt" || true
    tests/gpu/standin.sh docker-up .gpu/docker.tar.xz
    # The base (a docker import of the host's root filesystem) builds while the pieces travel.
    setsid bash -c "tests/gpu/standin.sh base >$STATE/base.log 2>&1; echo \$? >$STATE/base.rc" </dev/null &
    if [ "$#" -gt 0 ]; then cp "$@" "$PIECES"/; fi
    ;;
piece)
    shift
    cp "$@" "$PIECES"/
    find "$PIECES" -type f | wc -l
    ;;
shape|startup|assemble)
    for _ in $(seq 300); do [ -f "$STATE/base.rc" ] && break; sleep 1; done
    cat "$STATE/base.log"
    [ "$(cat "$STATE/base.rc" 2>/dev/null)" = 0 ] || { echo "proof: the stand-in base failed" >&2; exit 1; }
    if [ ! -f "$STATE/payload.done" ]; then
        (cd "$PIECES" && sha256sum -- * | tee "$OUT/pieces.sha256")
        tests/gpu/standin.sh payload "$PIECES"/payload.tar.xz.* | tee "$OUT/payload.txt"
        touch "$STATE/payload.done"
    fi
    [ "$1" = assemble ] && exit 0
    if [ ! -f /tmp/imgfab-hostsite/.done ]; then
        mkdir -p /tmp/imgfab-hostsite
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/imgfab-hostsite .gpu/hostwheels/*.whl
        touch /tmp/imgfab-hostsite/.done
    fi
    eval "$(tests/gpu/standin.sh env)"
    # imgfab itself runs on the host with the payload's pydantic and this docker SDK
    export PYTHONPATH=/tmp/imgfab-hostsite:/opt/venv/lib/python3.12/site-packages
    export IMGFAB_GPU_PROOF_OUT="$OUT" PYTHONUNBUFFERED=1
    if [ "$1" = startup ]; then
        # bench/startup.py, one phase per call (capture, starts, seeded, shapes: 10 minutes each at most)
        keep=/tmp/imgfab-startup-out
        case ",$2," in *,pull,*) tests/gpu/standin.sh registry ;; esac
        status=0
        python3 bench/startup.py --out "$keep" --phase "$2" 2>&1 | tee "$OUT/startup-${2//,/-}.log" | tail -n 60 || status=$?
        cp "$keep"/*.json "$OUT"/ 2>/dev/null || true
        tar -C "$keep" -cJf "$OUT/logs-${2//,/-}.tar.xz" --exclude='*.json' . || true
        exit "$status"
    fi
    selection="$2"
    [ "$2" = runsh ] && selection="standin_dockerfile or runsh"
    [ "$2" = nocc ] && selection="no_c_compiler"
    python3 -m pytest -m gpu tests/gpu/test_gpu_vllm_shapes.py -k "$selection" -x -q -s -p no:cacheprovider 2>&1 | tee "$OUT/pytest-$2.log" | tail -n 40
    ;;
select)
    tests/gpu/standin.sh registry
    eval "$(tests/gpu/standin.sh env)"
    export PYTHONPATH=/tmp/imgfab-hostsite:/opt/venv/lib/python3.12/site-packages
    export IMGFAB_GPU_PROOF_OUT="$OUT" PYTHONUNBUFFERED=1
    python3 -m pytest -m gpu tests/gpu/test_gpu_select.py -x -q -s -p no:cacheprovider 2>&1 | tee "$OUT/pytest-select.log" | tail -n 40
    ;;
*)
    echo "usage: $0 setup PIECE... | piece PIECE... | shape runsh|compose|k8s | select" >&2
    exit 2
    ;;
esac
