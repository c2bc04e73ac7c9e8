"""Which matrix GPU a host's GPU is: the product name NVML reports, and its memory.

NVML (``nvmlDeviceGetName``, what ``nvidia-smi --query-gpu=name`` prints) names a product, e.g.
``NVIDIA H100 80GB HBM3``; ``compat/gpus.yaml`` records those strings per GPU as ``nvml_names``,
each with its source. :func:`match_gpu` takes such a name (or a matrix name or alias) and,
optionally, the memory NVML reports, and returns the one matrix GPU it is, or raises
:class:`~imgfab.errors.RecipeError` (exit 2) naming the field and the fix.

The matching rule:

1. Every GPU is known by its ``name``, its ``aliases`` and its ``nvml_names``; the candidates
   for a reported name are the GPUs one of whose names has the same :func:`nvml_key`. The key
   folds the spellings one product is seen under, and nothing else: case, runs of spaces, ``-``
   and ``_`` (Kubernetes GPU feature discovery labels join the words with ``-``, vLLM's tuned
   config file names with ``_``), characters GFD drops, and the leading brand words ``NVIDIA``
   and ``Tesla`` (drivers before R470 print ``A100-SXM4-40GB``, later ones add ``NVIDIA``).
2. With the reported memory, the candidate whose nominal ``memory_gib`` is nearest wins, and
   the memory must lie in its usable range, :data:`USABLE_FRACTION` of the nominal: GDDR6 cards
   with ECC on keep 1/16 back (a T4 reports 15360 MiB of 16 GiB, an L40S 46068 MiB of 48),
   HBM parts report 99-100 % (an H200 143771 MiB of 141 GiB, an A100 80GB 81920 MiB), and no
   GPU reports more than its nominal. Without memory, a name with two candidates is an error.

:func:`check_nvml_names` is the load-time data check: two GPUs may share a key only when their
usable ranges do not overlap, so that memory always tells them apart.

The memory a GPU has for serving is what the driver reports, not the marketed capacity: vLLM
budgets ``total × gpu_memory_utilization`` of the total NVML reports (``v1/worker/utils.py``),
and a 24 GiB L4 reports 23034 MiB. Each record gives that total as ``reported_mib`` with its
``reported_mib_source`` where one was seen in public nvidia-smi/NVML output; :func:`budget_mib`
is what the fit counts: ``reported_mib``, else :data:`FALLBACK_FRACTION` of ``memory_gib``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from imgfab.errors import MatrixError, RecipeError
from imgfab.matrix.records import Gpu, NvmlName

# Reported total memory / nominal memory_gib, for the memory to belong to that GPU.
USABLE_FRACTION = (0.85, 1.02)
# Where no reported total is recorded, the fit counts this fraction of memory_gib: the lowest
# ratio recorded in compat/gpus.yaml is the L4's, 23034 / (24 × 1024) = 0.9373 (GDDR6 with ECC
# keeps 1/16 back, and the L4 6 MiB more), rounded down, so that an unrecorded GPU is never
# counted with more memory than a recorded one of its kind reports.
FALLBACK_FRACTION = 0.93

_BRANDS = ("nvidia", "tesla")
_SEPARATORS = re.compile(r"[\s_-]+")
_DROPPED = re.compile(r"[^a-z0-9.]")  # GFD's sanitise keeps [A-Za-z0-9-_. ]
_MEMORY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(MiB|GiB|B)?\s*")


def nvml_key(name: str) -> str:
    """The spelling-independent form of a GPU product name.

    >>> nvml_key("NVIDIA H100 80GB HBM3") == nvml_key("NVIDIA-H100-80GB-HBM3") == "h100-80gb-hbm3"
    True
    >>> nvml_key("Tesla T4")
    't4'
    """
    words = [_DROPPED.sub("", word) for word in _SEPARATORS.split(name.strip().lower())]
    words = [word for word in words if word]
    while len(words) > 1 and words[0] in _BRANDS:
        words.pop(0)
    return "-".join(words)


def memory_gib(value: int | float | str) -> float:
    """GiB from NVML's total (bytes, an int) or nvidia-smi's ``memory.total`` text: ``143771 MiB``
    (``--format=csv``) or ``143771`` (``nounits``, MiB). Raises ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory size")
    if isinstance(value, (int, float)):
        gib = float(value) / 2**30
    elif isinstance(value, str) and (found := _MEMORY.fullmatch(value)):
        number, unit = float(found.group(1)), found.group(2) or "MiB"
        gib = number / {"B": 2**30, "MiB": 2**10, "GiB": 1}[unit]
    else:
        raise ValueError(f"{value!r} is not a memory size (bytes, or MiB as nvidia-smi prints it)")
    if gib <= 0:
        raise ValueError(f"{value!r} is not a memory size")
    return gib


def usable_range(gpu: Gpu) -> tuple[float, float]:
    """The GiB a host may report for ``gpu``: :data:`USABLE_FRACTION` of its nominal memory."""
    low, high = USABLE_FRACTION
    return gpu.memory_gib * low, gpu.memory_gib * high


def budget_mib(gpu: Gpu) -> int:
    """The MiB of one ``gpu`` that the fit counts: its ``reported_mib``, else
    :data:`FALLBACK_FRACTION` of ``memory_gib``, rounded down.

    >>> from imgfab.matrix.records import Gpu
    >>> budget_mib(Gpu(name="L40", aliases=(), compute_capability="8.9", architecture="ada",
    ...                memory_gib=48, source="s", confirmed=False))
    45711
    """
    return gpu.reported_mib or int(gpu.memory_gib * 1024 * FALLBACK_FRACTION)


def reported_text(gpu: Gpu) -> str:
    """How a fit line names one GPU's memory: ``24 GiB, 23034 MiB reported`` (``… MiB
    assumed`` where compat/gpus.yaml records no reported total)."""
    how = "reported" if gpu.reported_mib else f"assumed, {FALLBACK_FRACTION:.0%} of nominal"
    return f"{gpu.memory_gib:g} GiB, {budget_mib(gpu)} MiB {how}"


def parse_reported_mib(row: dict[str, Any], where: str) -> dict[str, Any]:
    """``reported_mib`` and ``reported_mib_source`` of one gpus.yaml record, validated: a whole
    number of MiB with a source, within :data:`USABLE_FRACTION` of ``memory_gib``."""
    value, source = row.get("reported_mib"), row.get("reported_mib_source")
    if value is None:
        if source:
            raise MatrixError(f"{where}: reported_mib_source without reported_mib",
                              field="compat/gpus.yaml", fix="give the MiB the source shows")
        return {}
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MatrixError(f"{where}: reported_mib {value!r} is not a whole number of MiB",
                          field="compat/gpus.yaml", fix="give memory.total as nvidia-smi prints it, in MiB")
    if not source:
        raise MatrixError(f"{where}: reported_mib {value} has no reported_mib_source",
                          field="compat/gpus.yaml",
                          fix="cite the nvidia-smi or NVML output it was read from, or leave it out")
    nominal = float(row.get("memory_gib") or 0) * 1024
    low, high = USABLE_FRACTION
    if not nominal * low <= value <= nominal * high:
        raise MatrixError(f"{where}: reported_mib {value} is not {low:.0%}-{high:.0%} of memory_gib "
                          f"{row.get('memory_gib')}", field="compat/gpus.yaml",
                          fix="check both numbers: a GPU reports slightly less than its nominal memory")
    return {"reported_mib": value, "reported_mib_source": str(source)}


def parse_nvml_names(value: Any, where: str) -> tuple[NvmlName, ...]:
    """The ``nvml_names`` list of one gpus.yaml record; each entry needs a name and a source."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MatrixError(f"{where}: nvml_names must be a list of records", field="compat/gpus.yaml")
    names = []
    for index, row in enumerate(value):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or not row.get("source"):
            raise MatrixError(f"{where}: nvml_names[{index}] needs a name and a source",
                              field="compat/gpus.yaml",
                              fix="give the string NVML prints and where it was seen")
        names.append(NvmlName(name=row["name"], source=str(row["source"]),
                              confirmed=bool(row.get("confirmed", False)), note=str(row.get("note") or "")))
    return tuple(names)


def _keys(gpu: Gpu) -> set[str]:
    return {nvml_key(n) for n in (gpu.name, *gpu.aliases, *(e.name for e in gpu.nvml_names))}


def check_nvml_names(gpus: Sequence[Gpu]) -> None:
    """Raise MatrixError when a name (NVML name, matrix name or alias, by :func:`nvml_key`) stands
    for two GPUs whose memory cannot tell them apart, or an NVML name is empty."""
    owners: dict[str, list[Gpu]] = {}
    for gpu in gpus:
        for entry in gpu.nvml_names:
            if not nvml_key(entry.name):
                raise MatrixError(f"gpu {gpu.name}: nvml name {entry.name!r} is empty",
                                  field="compat/gpus.yaml")
        if gpu.nvml_names and gpu.memory_gib <= 0:
            raise MatrixError(f"gpu {gpu.name} has nvml_names but no memory_gib to match them by",
                              field="compat/gpus.yaml", fix="add memory_gib")
        for key in _keys(gpu):
            owners.setdefault(key, []).append(gpu)
    for key, sharing in owners.items():
        ranges = sorted((usable_range(g), g.name) for g in sharing)
        for (first, name), (second, other) in zip(ranges, ranges[1:]):
            if second[0] <= first[1]:
                raise MatrixError(
                    f"GPU name {key!r} stands for {name} and {other}, whose memory "
                    f"({first[0]:.1f}-{first[1]:.1f} and {second[0]:.1f}-{second[1]:.1f} GiB usable) "
                    "cannot tell them apart", field="compat/gpus.yaml",
                    fix="list the name under one GPU only, or correct memory_gib")


def match_gpu(gpus: Sequence[Gpu], name: str, memory: int | float | str | None = None, *,
              field: str = "--gpu") -> Gpu:
    """The matrix GPU that ``name`` (a matrix name or alias, or an NVML product name) is, told
    apart by ``memory`` (NVML bytes or nvidia-smi MiB) where the name alone is ambiguous.

    >>> from imgfab.matrix.compat import load_matrix
    >>> match_gpu(load_matrix().gpus, "NVIDIA H200", 150754820096).name
    'H200'

    Raises RecipeError (``field``: what was wrong; fix: pass ``--gpu`` with a matrix name).
    """
    known = ", ".join(g.name for g in gpus)
    key = nvml_key(name)
    candidates = [g for g in gpus if key and key in _keys(g)]
    if not candidates:
        raise RecipeError(f"unknown GPU {name!r}: no name, alias or nvml_names entry of "
                          "compat/gpus.yaml is it", field=field,
                          fix=f"pass --gpu with one of: {known} (or add the name nvidia-smi prints "
                              "to that GPU's nvml_names)")
    sizes = " or ".join(f"{g.name} ({g.memory_gib:g} GiB)" for g in candidates)
    if memory is None:
        if len(candidates) == 1:
            return candidates[0]
        raise RecipeError(f"GPU {name!r} is {sizes} in compat/gpus.yaml, and no memory size was "
                          "given to tell them apart", field=field,
                          fix=f"pass --gpu {' or --gpu '.join(g.name for g in candidates)}")
    try:
        gib = memory_gib(memory)
    except ValueError as exc:
        raise RecipeError(str(exc), field=field, fix="pass --gpu with a name from compat/gpus.yaml") from None
    nearest = min(candidates, key=lambda g: abs(g.memory_gib - gib))
    low, high = usable_range(nearest)
    if not low <= gib <= high:
        raise RecipeError(
            f"GPU {name!r} reports {gib:.1f} GiB of memory, which is not {sizes} of compat/gpus.yaml "
            f"(a GPU reports {USABLE_FRACTION[0]:.0%}-{USABLE_FRACTION[1]:.0%} of its nominal memory)",
            field=field, fix="pass --gpu with this GPU's name from compat/gpus.yaml, or record it "
                             "there (nvml_names and memory_gib)")
    return nearest
