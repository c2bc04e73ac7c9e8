"""This host's driver and GPUs, as `imgfab select` and `imgfab doctor` read them.

NVML through ``pynvml`` (package ``nvidia-ml-py``) when it is importable, else ``nvidia-smi``,
which the driver installs beside ``libnvidia-ml`` (imgfab itself does not depend on
nvidia-ml-py). Both report the same facts: the driver version and, per GPU, its product name,
compute capability and total memory; :attr:`HostFacts.via` says which one answered. With
neither, or when the one there fails, :attr:`HostFacts.error` says why (no GPU here, no
driver, a driver too old for the query) and nothing else is guessed. The CPU (:func:`this_machine`) is
:func:`platform.machine`'s answer.
"""

from __future__ import annotations

import csv
import platform
import subprocess
from typing import Callable

from imgfab.in_image.facts import GpuFacts, HostFacts, Nvml, read_host

# compute_cap is a query field since the R510 drivers; memory.total is MiB under nounits.
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version",
              "--format=csv,noheader,nounits")

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def read_nvidia_smi(run: Runner = _run) -> HostFacts:
    """This host's facts from ``nvidia-smi --query-gpu`` (``run`` is the edge tests replace);
    never raises."""
    try:
        result = run(list(NVIDIA_SMI))
    except FileNotFoundError:
        return HostFacts(error="neither NVML (python package nvidia-ml-py) nor nvidia-smi is "
                               "installed: no NVIDIA driver visible", via="nvidia-smi")
    except (OSError, subprocess.SubprocessError) as exc:
        return HostFacts(error=f"nvidia-smi did not run: {exc}", via="nvidia-smi")
    if result.returncode != 0:
        said = " ".join((result.stderr or result.stdout or "").split())[:200]
        return HostFacts(error=f"nvidia-smi failed (exit {result.returncode}): {said or 'no output'}",
                         via="nvidia-smi")
    gpus, drivers = [], set()
    for row in csv.reader(line for line in result.stdout.splitlines() if line.strip()):
        cells = [cell.strip() for cell in row]
        if len(cells) != 5 or not cells[0].isdigit() or not _capability(cells[2]):
            return HostFacts(error=f"nvidia-smi printed {','.join(cells)[:120]!r}, not "
                                   "index, name, compute_cap, memory.total, driver_version",
                             via="nvidia-smi")
        mib = cells[3]
        gpus.append(GpuFacts(int(cells[0]), cells[1], cells[2],
                             int(mib) * 2**20 if mib.isdigit() and int(mib) > 0 else None))
        drivers.add(cells[4])
    if len(drivers) > 1:
        return HostFacts(error=f"nvidia-smi reports several drivers: {', '.join(sorted(drivers))}",
                         via="nvidia-smi")
    return HostFacts(driver=drivers.pop() if drivers else None, gpus=gpus, via="nvidia-smi")


def _capability(text: str) -> bool:
    major, dot, minor = text.partition(".")
    return bool(dot) and major.isdigit() and minor.isdigit()


def read_this_host(nvml: Nvml | None, run: Runner = _run) -> HostFacts:
    """NVML's answer when ``nvml`` (``pynvml``, or None when it is not importable) is there,
    else nvidia-smi's. An NVML that is there but fails is the answer: nvidia-smi sits on the
    same library and would fail the same way."""
    if nvml is not None:
        return read_host(nvml)
    return read_nvidia_smi(run)


def this_machine() -> str:
    """This machine's CPU as the kernel names it (``x86_64``, ``aarch64``): what
    :func:`imgfab.stack.verdicts.platform_of_machine` turns into the platform images must have."""
    return platform.machine()
