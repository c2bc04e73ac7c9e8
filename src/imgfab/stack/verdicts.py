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
