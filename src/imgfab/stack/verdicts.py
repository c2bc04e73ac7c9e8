"""An image's own rules over its labels: driver floor, GPU architecture, precision.

The in-image probe judges the host it starts on; :mod:`imgfab.ops.select` (at pull) and the
k8s placement (:mod:`imgfab.render.placement`, at schedule) judge a host by the image's
``org.imgfab.*`` labels with these functions, which apply the same :mod:`imgfab.in_image.rules`.
Pure: labels in, :class:`~imgfab.in_image.rules.Verdict` out.
"""

from __future__ import annotations

from imgfab.in_image.rules import (Verdict, check_arch, check_driver, check_driver_ceiling,
                                   check_precision, major_minor, parse_ceilings)

P = "org.imgfab"

# The one platform imgfab builds (the matrix records x86_64 wheels and amd64 nvidia/cuda tags;
# :func:`imgfab.stack.resolve.refuse_cpu_arch` refuses aarch64 GPUs): every image records it in
# its ``org.imgfab.platform`` label, and select, doctor and the k8s placement judge by it.
IMAGE_PLATFORM = "linux/amd64"
# What a CPU calls itself (``platform.machine()``, compat/gpus.yaml ``cpu_arch``) → the OCI
# architecture a platform names (the GOARCH spelling Docker, OCI and kubernetes.io/arch use).
_OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def platform_of_machine(machine: str) -> str:
    """The ``os/architecture`` platform of a Linux host whose CPU is ``machine``:
    ``x86_64`` → ``linux/amd64``, ``aarch64`` → ``linux/arm64``; another name is kept as it is
    (``ppc64le`` → ``linux/ppc64le``), so it matches no image imgfab builds."""
    name = machine.strip().lower()
    return f"linux/{_OCI_ARCH.get(name, name or 'unknown')}"


def image_platform(labels: dict[str, str], config_platform: str = "") -> str:
    """The platform an image runs on: its ``org.imgfab.platform`` label, else (images built
    before the label) its config's ``os/architecture`` as the registry gave it; '' when neither
    says. A variant (``linux/arm64/v8``) is dropped: hosts are judged by os and architecture."""
    said = labels.get(f"{P}.platform") or config_platform
    return "/".join(str(said).split("/")[:2]) if said else ""


def platform_verdict(platform: str, host_platform: str, host_seen: str = "") -> Verdict:
    """Does an image of ``platform`` run on a host of ``host_platform``? ``host_seen`` says
    where the host's platform came from (e.g. "GH200 hosts are aarch64 (compat/gpus.yaml)")."""
    where = f" ({host_seen})" if host_seen else ""
    if not platform:
        return Verdict(False, "platform", f"the image records no platform (no {P}.platform label, "
                       f"no os/architecture in its config): this host is {host_platform}{where}",
                       "rebuild it with imgfab build, which labels the platform")
    if platform == host_platform:
        return Verdict(True, "platform", f"{platform} image on a {host_platform} host")
    return Verdict(False, "platform", f"{platform} image: this host is {host_platform}{where}",
                   f"run it on a {platform} host (imgfab builds {IMAGE_PLATFORM} images only)")


def label_problem(labels: object) -> str | None:
    """Why ``labels`` cannot be judged (not a mapping of strings), or None."""
    if not isinstance(labels, dict):
        return f"labels are a {type(labels).__name__}, not a mapping"
    bad = sorted(str(k)[:60] for k, v in labels.items()
                 if not isinstance(k, str) or not isinstance(v, str))
    return f"label {bad[0]} is not a string" if bad else None


def driver_verdict(labels: dict[str, str], driver: str) -> Verdict:
    """The image's driver floor and policy (its labels) against a host driver."""
    return check_driver(
        driver, floor=labels[f"{P}.driver.floor"], policy=labels.get(f"{P}.driver.policy", "strict"),
        cuda=labels.get(f"{P}.cuda.runtime") or labels.get(f"{P}.cuda", "?"), strict_floor=labels.get(f"{P}.driver.strict_floor") or None,
        compat_floor=labels.get(f"{P}.driver.compat_floor") or None)


def ceilings_of(labels: dict[str, str]) -> dict[str, str]:
    """The image's ``driver.ceilings`` label: compute capability → NVIDIA's last driver branch
    ({} when absent). Raises ValueError on a malformed label."""
    return parse_ceilings(labels.get(f"{P}.driver.ceilings", ""))


def gpu_verdicts(labels: dict[str, str], gpu: str, compute_capability: str,
                 driver: str | None = None) -> list[Verdict]:
    """The image's kernel architectures and precision (its labels) against one GPU, and, when
    the host ``driver`` is given, NVIDIA's last driver branch for that GPU (``driver.ceilings``)."""
    verdicts = []
    ceilings = ceilings_of(labels)
    if driver is not None and major_minor(compute_capability) in ceilings:
        verdicts.append(check_driver_ceiling(driver, compute_capability, ceilings=ceilings, gpu=gpu))
    archs = [a for a in labels.get(f"{P}.archs", "").split(",") if a]
    if archs:
        verdicts.append(check_arch(compute_capability, archs,
                                   exact=labels.get(f"{P}.arch.exact") == "true", gpu=gpu))
    else:  # the matrix row had no confirmed kernel list: nothing to check, and it says so
        verdicts.append(Verdict(True, "arch", "kernel architectures unknown (unconfirmed "
                                "matrix row): not checked"))
    precision = labels.get(f"{P}.precision", "auto")
    if precision not in ("auto", ""):
        verdicts.append(check_precision(
            precision, compute_capability, min_cc=labels.get(f"{P}.precision.min_cc") or None,
            max_cc=labels.get(f"{P}.precision.max_cc") or None, backend=labels.get(f"{P}.backend", ""),
            gpu=gpu))
    return verdicts


def is_imgfab_image(labels: dict[str, str]) -> bool:
    return bool(labels.get(f"{P}.driver.floor"))
