"""Where a Kubernetes pod of an image may run, from the image's own labels and rules.

The probe (at start) and ``imgfab select`` (at pull) judge a host by the image's labels with
:mod:`imgfab.in_image.rules`; :func:`node_affinity_terms` applies the very same verdicts
(:func:`imgfab.stack.verdicts.gpu_verdicts`) to every GPU the matrix knows and turns the compute
capabilities that pass into node-affinity terms on the labels NVIDIA's GPU Feature Discovery
puts on GPU nodes. The driver floor becomes terms on the driver-version labels, and NVIDIA's
last driver branch for an architecture (``driver.ceilings``) a ``Lt`` term beside that GPU's
capability, so the scheduler never places a pod where the probe would refuse to start.

GPU Feature Discovery labels (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery README):
``nvidia.com/gpu.compute.major`` / ``.minor`` and ``nvidia.com/cuda.driver.major`` /
``.minor`` / ``.rev`` (integers as strings; ``Gt`` compares them as integers).

What fits (:func:`capacity_terms`), on the labels GFD writes per node
(NVIDIA/k8s-device-plugin@02f65ccaccdaa3f0e027d3ed13367419cde45730:internal/lm/resource.go):
``nvidia.com/gpu.memory`` (the GPU's total memory in MiB, NVML's total) ≥ what one GPU must
hold of the weights and the KV cache at ``gpu_memory_utilization`` (:mod:`imgfab.stack.fit`);
``nvidia.com/gpu.count`` (GPUs on the node) ≥ the GPUs one pod asks for; and for a TensorRT
engine, exact to one GPU, ``nvidia.com/gpu.product`` (the NVML name, spaces as ``-``) one of
that GPU's names in ``compat/gpus.yaml`` ``nvml_names``.

The CPU (:func:`platform_terms`): ``kubernetes.io/arch`` (the kubelet's well-known label, GOARCH:
``amd64``, ``arm64``) from the image's ``org.imgfab.platform``, in every term, so that a Grace
node (GH200, GB200: arm64) whose GPU passes the rules never gets an amd64 pod.
"""

from __future__ import annotations

from typing import Any

from imgfab.in_image.rules import parse_version

CC_MAJOR = "nvidia.com/gpu.compute.major"
CC_MINOR = "nvidia.com/gpu.compute.minor"
GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_PRODUCT = "nvidia.com/gpu.product"
NODE_ARCH = "kubernetes.io/arch"
DRIVER_LABELS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                 "nvidia.com/cuda.driver.rev")


def allowed_compute_capabilities(labels: dict[str, str], matrix: Any) -> list[str]:
    """Compute capabilities of the matrix's GPUs on which the image's labels pass every GPU
    rule (kernel architectures, exact for engines; precision), sorted by version."""
    from imgfab.stack.verdicts import gpu_verdicts  # noqa: PLC0415

    allowed = set()
    for gpu in matrix.gpus:
        if all(v.ok for v in gpu_verdicts(labels, gpu.name, gpu.compute_capability)):
            allowed.add(gpu.compute_capability)
    return sorted(allowed, key=parse_version)


def driver_floor_terms(floor: str) -> list[list[dict[str, Any]]]:
    """Match expressions (ORed terms of ANDed expressions) for a driver ≥ ``floor``.

    ``535.104.05`` → major > 535; or major 535 and minor > 104; or 535.104 and rev > 4.
    """
    parts = floor.split(".")
    terms: list[list[dict[str, Any]]] = []
    for depth, part in enumerate(parts):
        equal = [{"key": DRIVER_LABELS[i], "operator": "In", "values": [parts[i]]} for i in range(depth)]
        # Gt is strict: the last part may equal the floor's (Gt n-1), the others must exceed it.
        bound = int(part) - 1 if depth == len(parts) - 1 else int(part)
        terms.append(equal + [{"key": DRIVER_LABELS[depth], "operator": "Gt", "values": [str(bound)]}])
    return terms


def node_affinity_terms(labels: dict[str, str], matrix: Any) -> list[list[dict[str, Any]]]:
    """``nodeSelectorTerms`` match expressions: (an allowed compute capability) AND (a driver ≥
    the image's floor). Empty when no known GPU passes: the caller refuses such an image."""
    from imgfab.stack.verdicts import ceilings_of  # noqa: PLC0415

    ccs = allowed_compute_capabilities(labels, matrix)
    floor = labels.get("org.imgfab.driver.floor", "")
    drivers = driver_floor_terms(floor) if floor else [[]]
    ceilings = ceilings_of(labels)
    terms = []
    for cc in ccs:
        major, minor = cc.split(".")
        gpu = [{"key": CC_MAJOR, "operator": "In", "values": [major]},
               {"key": CC_MINOR, "operator": "In", "values": [minor]}]
        # NVIDIA's last driver branch for this GPU's architecture: a node on a newer branch
        # does not run it (Lt is strict: major < last + 1).
        if cc in ceilings:
            gpu.append({"key": DRIVER_LABELS[0], "operator": "Lt", "values": [str(int(ceilings[cc]) + 1)]})
        for driver in drivers:
            terms.append(gpu + driver)
    return terms



def platform_terms(labels: dict[str, str]) -> list[dict[str, Any]]:
    """The match expression every node-affinity term carries: the node's ``kubernetes.io/arch``
    is the architecture of the image's ``org.imgfab.platform`` (``linux/amd64`` → ``amd64``).
    Raises ValueError when the label is missing or is not ``linux/<arch>``."""
    platform = labels.get("org.imgfab.platform", "")
    os_name, _, arch = platform.partition("/")
    arch = arch.split("/")[0]
    if os_name != "linux" or not arch.isalnum():
        raise ValueError(f"the image's org.imgfab.platform label is {platform[:60]!r}, not "
                         "linux/<architecture>: its pods' kubernetes.io/arch is unknown")
    return [{"key": NODE_ARCH, "operator": "In", "values": [arch]}]


def product_label(nvml_name: str) -> str:
    """GFD's ``nvidia.com/gpu.product`` for a GPU NVML names ``nvml_name`` (spaces as ``-``)."""
    return nvml_name.replace(" ", "-")


def capacity_terms(*, per_gpu_mib: int | None, gpus_per_pod: int,
                   products: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Match expressions every node-affinity term also carries: GPU memory ≥ ``per_gpu_mib``
    (left out when the model facts are unknown), at least ``gpus_per_pod`` GPUs on the node,
    and, for an engine, the product one of ``products`` (NVML names). ``Gt`` is strict: n - 1."""
    terms: list[dict[str, Any]] = []
    if per_gpu_mib is not None:
        terms.append({"key": GPU_MEMORY, "operator": "Gt", "values": [str(per_gpu_mib - 1)]})
    terms.append({"key": GPU_COUNT, "operator": "Gt", "values": [str(gpus_per_pod - 1)]})
    if products:
        terms.append({"key": GPU_PRODUCT, "operator": "In",
                      "values": sorted({product_label(p) for p in products})})
    return terms
