"""`imgfab doctor`: the host checks operators hit when GPU containers fail.

:func:`diagnose` takes a :class:`HostView` (files, command outputs, NVML, limits, Docker info),
so every failure case is testable with recorded answers; :func:`live_view` reads this machine.
Each :class:`Finding` has a severity (ok, info, warn, error), what was seen, and the fix.
On a machine without GPUs it says so plainly and still checks the rest.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from imgfab.docker.engine import MIN_ENGINE, engine_facts
from imgfab.errors import RecipeError
from imgfab.in_image.facts import HostFacts, load_nvml
from imgfab.matrix.compat import Matrix
from imgfab.matrix.gpus import memory_gib, nvml_key
from imgfab.ops.host import read_this_host, this_machine
from imgfab.stack.verdicts import (IMAGE_PLATFORM, driver_verdict, gpu_verdicts, image_platform,
                                   is_imgfab_image, label_problem, platform_of_machine,
                                   platform_verdict)

GIB = 1024**3


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # ok | info | warn | error
    seen: str
    fix: str = ""

    def line(self) -> str:
        text = f"[{self.severity}] {self.check}: {self.seen}"
        return f"{text} — fix: {self.fix}" if self.fix and self.severity in ("warn", "error") else text


@dataclass
class HostView:
    """What doctor looks at; every field may come from a recording."""

    files: dict[str, str | None] = field(default_factory=dict)  # path → text or None
    host: HostFacts = field(default_factory=HostFacts)
    cuda_ceiling: str | None = None  # driver's CUDA version, e.g. "12.2"
    shm_bytes: int | None = None
    memlock_soft: int | None = None  # bytes; -1 = unlimited
    free_disk_bytes: int | None = None
    docker_info: dict[str, Any] | None = None
    docker_error: str | None = None
    buildx: str | None = None  # `docker buildx version`'s line; None: no plugin (or not checked)
    tools: dict[str, str | None] = field(default_factory=dict)  # name → path or None
    machine: str | None = None  # the CPU, platform.machine() (x86_64, aarch64); None: not read


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def live_view(docker_info: Callable[[], dict[str, Any]] | None = None,
              buildx_version: Callable[[], str | None] | None = None) -> HostView:
    """Read this machine. ``docker_info`` and ``buildx_version`` are injected by the CLI
    (engine.py talks to Docker)."""
    nvml = load_nvml()
    host = read_this_host(nvml)  # NVML, else nvidia-smi
    ceiling = None
    if nvml is not None and host.error is None:
        try:
            nvml.nvmlInit()
            version = nvml.nvmlSystemGetCudaDriverVersion()  # type: ignore[attr-defined]
            ceiling = f"{version // 1000}.{(version % 1000) // 10}"
            nvml.nvmlShutdown()
        except Exception:  # the ceiling is informative only
            ceiling = None
    try:
        shm = os.statvfs("/dev/shm")
        shm_bytes = shm.f_frsize * shm.f_blocks
    except OSError:
        shm_bytes = None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    info, error = None, None
    if docker_info is not None:
        try:
            info = docker_info()
        except Exception as exc:  # reported as a finding
            error = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    root = (info or {}).get("DockerRootDir") or "/var/lib/docker"
    disk_path = root if os.path.exists(root) else "/"
    return HostView(
        files={p: _read(p) for p in ("/proc/driver/nvidia/version", "/proc/modules",
                                      "/etc/docker/daemon.json", "/sys/fs/cgroup/cgroup.controllers",
                                      "/etc/nvidia-container-runtime/config.toml")},
        host=host, cuda_ceiling=ceiling, shm_bytes=shm_bytes,
        memlock_soft=-1 if soft == resource.RLIM_INFINITY else soft,
        free_disk_bytes=shutil.disk_usage(disk_path).free, docker_info=info, docker_error=error,
        buildx=buildx_version() if buildx_version is not None and info is not None else None,
        tools={name: shutil.which(name) for name in ("nvidia-smi", "nvidia-ctk", "nvidia-container-runtime")},
        machine=this_machine())


def diagnose(view: HostView, *, image_labels: dict[str, str] | None = None,
             image_bytes: int | None = None, matrix: Matrix | None = None) -> list[Finding]:
    """All findings for this host (and, with ``image_labels``, for that image on it; with
    ``matrix``, which compat/gpus.yaml GPU each host GPU is, as `imgfab select` matches it)."""
    findings: list[Finding] = []
    add = findings.append
    modules = view.files.get("/proc/modules") or ""
    loaded = {line.split()[0] for line in modules.splitlines() if line.strip()}
    version_file = view.files.get("/proc/driver/nvidia/version")
    gpu_present = bool(view.host.gpus) or "nvidia" in loaded or version_file is not None

    # --- the CPU: every image imgfab builds is linux/amd64 ------------------------------------
    findings.extend(platform_findings(view.machine))

    # --- driver -----------------------------------------------------------------------
    if "nouveau" in loaded:
        add(Finding("nouveau", "error", "the nouveau kernel module is loaded",
                    "blacklist nouveau (modprobe.d), regenerate the initramfs and reboot"))
    if not gpu_present:
        add(Finding("gpu", "info", "no NVIDIA GPU or driver on this machine (no nvidia module, NVML "
                    "unavailable); GPU containers cannot run here — the other checks still apply"))
    elif view.host.error:
        add(Finding("driver", "error", f"the nvidia module is loaded but NVML fails: {view.host.error}",
                    "reinstall the driver so the kernel module and libnvidia-ml match (reboot after an upgrade)"))
    else:
        names = ", ".join(f"{g.name} (cc {g.compute_capability})" for g in view.host.gpus)
        via = f" (read by {view.host.via})" if view.host.via != "NVML" else ""
        add(Finding("driver", "ok", f"driver {view.host.driver}; GPUs: {names or 'none visible'}{via}"))
        if matrix is not None:
            findings.extend(matrix_findings(view.host, matrix))
        if view.cuda_ceiling:
            add(Finding("cuda-ceiling", "info",
                        f"this driver supports CUDA ≤ {view.cuda_ceiling} natively; images need a driver "
                        "floor at or below it (or minor-version compatibility within the major)"))

    # --- docker & NVIDIA runtime -------------------------------------------------------
    if view.docker_error or view.docker_info is None:
        add(Finding("docker", "error", f"Docker engine not reachable: {view.docker_error or 'not checked'}",
                    "start the Docker engine (systemctl start docker), or point DOCKER_HOST at a running one"))
    else:
        info = view.docker_info
        add(Finding("docker", "ok", f"Docker {info.get('ServerVersion', '?')} reachable"))
        findings.extend(engine_findings(info, view.buildx))
        runtimes = set((info.get("Runtimes") or {}).keys())
        daemon = _json(view.files.get("/etc/docker/daemon.json"))
        cdi = info.get("CDISpecDirs") or []
        if "nvidia" in runtimes or "nvidia" in (daemon.get("runtimes") or {}):
            add(Finding("nvidia-runtime", "ok", "the nvidia runtime is configured in Docker"))
        elif cdi and view.tools.get("nvidia-ctk"):
            add(Finding("nvidia-runtime", "ok", f"CDI spec dirs {cdi} and nvidia-ctk present"))
        else:
            add(Finding("nvidia-runtime", "error" if gpu_present else "warn",
                        "neither the nvidia runtime nor CDI is configured: `--gpus` will fail",
                        "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` "
                        "and restart dockerd"))
        if (info.get("CgroupDriver") == "systemd" and str(info.get("CgroupVersion")) == "2"
                and gpu_present and not cdi):
            add(Finding("cgroups", "warn",
                        "systemd cgroup driver on cgroup v2 without CDI: containers lose GPU access after "
                        "`systemctl daemon-reload` ('Failed to initialize NVML: Unknown Error')",
                        "use CDI (nvidia-ctk cdi generate) or set exec-opts native.cgroupdriver=cgroupfs"))

    # --- limits ------------------------------------------------------------------------
    needed_shm = int(image_labels.get("org.imgfab.shm.min_bytes", 0)) if image_labels else GIB
    if view.shm_bytes is not None:
        if view.shm_bytes < needed_shm:
            add(Finding("shm", "warn", f"/dev/shm here is {view.shm_bytes / GIB:.1f} GiB (< {needed_shm / GIB:.1f} GiB)",
                        "containers get their own: run with --shm-size (run.sh/compose.yaml set it from the recipe)"))
        else:
            add(Finding("shm", "ok", f"/dev/shm is {view.shm_bytes / GIB:.1f} GiB"))
    if view.memlock_soft is not None and view.memlock_soft != -1 and view.memlock_soft < 64 * 1024**2:
        add(Finding("memlock", "warn", f"memlock ulimit is {view.memlock_soft // 1024} KiB",
                    "run containers with --ulimit memlock=-1 (NCCL/RDMA pin memory)"))
    if view.free_disk_bytes is not None:
        need = image_bytes or 20 * GIB
        severity = "ok" if view.free_disk_bytes >= need else "error"
        add(Finding("disk", severity, f"{view.free_disk_bytes / GIB:.1f} GiB free for images (need ≥ {need / GIB:.1f} GiB)",
                    "free space under Docker's data root or move it (data-root in daemon.json)"))

    # --- an image on this host -----------------------------------------------------------
    if image_labels is not None:
        findings.extend(pull_findings(image_labels, view.docker_info))
        findings.extend(image_findings(image_labels, view.host, machine=view.machine))
    return findings


def platform_findings(machine: str | None) -> list[Finding]:
    """On a host whose CPU is not x86_64 (a Grace GH200/GB200 node is aarch64): which images can
    run here. Nothing on an x86_64 host, or when the CPU was not read."""
    if not machine:
        return []
    platform = platform_of_machine(machine)
    if platform == IMAGE_PLATFORM:
        return []
    return [Finding("platform", "error", f"this host is {platform} (CPU {machine}): the images imgfab "
                    f"builds are {IMAGE_PLATFORM} only and cannot run here (`exec format error`); "
                    f"`imgfab select` refuses every one of them", f"run them on an x86_64 host "
                    f"(H100, H200, B200, ...); imgfab does not build {platform} images")]


def engine_findings(info: dict[str, Any], buildx: str | None) -> list[Finding]:
    """The engine's version, its image store and buildx, and what each missing feature costs."""
    facts = engine_facts(info)
    version, minimum = facts.version or "?", MIN_ENGINE
    found = []
    if facts.too_old():
        found.append(Finding("engine", "error", f"Docker Engine {version} is older than {minimum}: imgfab "
                             "cannot build here (no COPY --link, no SOURCE_DATE_EPOCH in BuildKit), and it "
                             "cannot pull images with zstd layers (org.imgfab.pull.requires)",
                             f"upgrade to Docker Engine {minimum} or newer"))
    else:
        found.append(Finding("engine", "ok", f"Docker Engine {version} (>= {minimum}: builds, and pulls zstd layers)"))
    storage = facts.storage or "?"
    if facts.containerd_store:
        found.append(Finding("image-store", "ok", f"containerd image store (snapshotter {storage}): images "
                             "keep their zstd layers and OCI media types as built, docker save writes the OCI layout"))
    else:
        found.append(Finding("image-store", "info", f"classic image store (storage driver {storage}): "
                             "this engine pulls and runs zstd images, but builds here store layers "
                             "uncompressed and push gzip only (imgfab build --compression gzip)",
                             'for zstd builds set {"features": {"containerd-snapshotter": true}} in '
                             "daemon.json and restart dockerd"))
    if buildx:
        found.append(Finding("buildx", "ok", f"{buildx} (docker build goes through BuildKit)"))
    else:
        found.append(Finding("buildx", "warn", "no docker buildx plugin: a CLI >= 23 refuses BuildKit "
                             "builds without it, so imgfab build fails here (pulling and running images is unaffected)",
                             "install the buildx plugin (docker-buildx-plugin, or Debian's docker-buildx)"))
    return found


def pull_findings(labels: dict[str, str], info: dict[str, Any] | None) -> list[Finding]:
    """Can this engine pull the image's layers (org.imgfab.pull.requires)?"""
    needs = labels.get("org.imgfab.pull.requires", "")
    if not needs:
        return []
    compression = labels.get("org.imgfab.layers.compression", "zstd")
    if info is None:
        return [Finding("image-pull", "info", f"the image's {compression} layers need {needs}; "
                        "the engine was not reachable to check")]
    facts = engine_facts(info)
    version = facts.version or "?"
    if facts.too_old():
        return [Finding("image-pull", "error", f"the image's {compression} layers need {needs}; "
                        f"this engine is Docker {version}", f"upgrade to Docker Engine {MIN_ENGINE} or newer, "
                        "or pull a gzip build of the recipe (imgfab build --compression gzip)")]
    return [Finding("image-pull", "ok", f"the image's {compression} layers ({needs}) pull on Docker {version}")]


def matrix_findings(host: HostFacts, matrix: Matrix) -> list[Finding]:
    """Which compat/gpus.yaml GPU each distinct host GPU is, by the name and memory it reports:
    what `imgfab select` without --gpu decides for (the first GPU)."""
    findings, judged = [], set()
    for gpu in host.gpus:
        if (gpu.name, gpu.memory_bytes) in judged:
            continue
        judged.add((gpu.name, gpu.memory_bytes))
        size = f", {memory_gib(gpu.memory_bytes):.1f} GiB" if gpu.memory_bytes else ""
        seen = f"GPU{gpu.index} {gpu.name}{size}"
        select = " (`imgfab select` without --gpu decides for it)" if gpu is host.gpus[0] else ""
        try:
            found = matrix.host_gpu(gpu.name, gpu.memory_bytes, field="--gpu")
        except RecipeError as error:
            findings.append(Finding("gpu-matrix", "warn", f"{seen} is not a GPU of compat/gpus.yaml: "
                                    f"{error.message}", f"`imgfab select` needs --gpu here; {error.fix}"))
            continue
        if gpu.compute_capability != found.compute_capability:
            findings.append(Finding("gpu-matrix", "error", f"{seen} reports compute capability "
                                    f"{gpu.compute_capability}, compat/gpus.yaml's {found.name} "
                                    f"{found.compute_capability}", "correct compat/gpus.yaml"))
            continue
        entry = next((e for e in found.nvml_names if nvml_key(e.name) == nvml_key(gpu.name)), None)
        unconfirmed = " (that name is unconfirmed in compat/gpus.yaml)" if entry and not entry.confirmed else ""
        findings.append(Finding("gpu-matrix", "ok", f"{seen} is {found.name} in compat/gpus.yaml "
                                f"(cc {found.compute_capability}, {found.architecture}){select}{unconfirmed}"))
    if len({(g.name, g.memory_bytes) for g in host.gpus}) > 1:
        findings.append(Finding("gpu-mixed", "info", "this host has GPUs of more than one model: "
                                "`imgfab select` without --gpu decides for GPU0 only"))
    return findings


def image_findings(labels: dict[str, str], host: HostFacts, *, machine: str | None = None) -> list[Finding]:
    """Would this image (its config labels) run here? The rules `select` applies, no layer pulled.
    With ``machine`` (this host's CPU), its ``org.imgfab.platform`` is judged first."""
    problem = label_problem(labels)
    if problem is not None:
        return [Finding("image", "error", f"the image's labels cannot be read: {problem}",
                        "rebuild it with imgfab build")]
    if not is_imgfab_image(labels):
        return [Finding("image", "error", "the image has no org.imgfab labels (not built by imgfab)",
                        "rebuild it with imgfab build")]
    found = []
    if machine and labels.get("org.imgfab.platform"):  # an older image's platform is in its config only
        verdict = platform_verdict(image_platform(labels), platform_of_machine(machine),
                                   f"this machine is {machine}")
        found.append(Finding("image-platform", "ok" if verdict.ok else "error", verdict.reason, verdict.fix))
    if host.error or not host.driver:
        return found + [Finding("image", "info", "no GPU driver here: the image's driver/arch rules cannot be checked")]
    try:
        verdicts = [driver_verdict(labels, host.driver)]
        for gpu in host.gpus:
            verdicts += gpu_verdicts(labels, f"GPU{gpu.index} {gpu.name}", gpu.compute_capability,
                                     driver=host.driver)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return found + [Finding("image", "error", f"the image's org.imgfab labels cannot be read: "
                                f"{str(exc)[:120]}", "rebuild it with imgfab build")]
    return found + [Finding(f"image-{v.check}", "ok" if v.ok else "error", v.reason, v.fix) for v in verdicts]


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def exit_code(findings: list[Finding]) -> int:
    """1 when any finding is an error, else 0."""
    return 1 if any(f.severity == "error" for f in findings) else 0


def to_json(findings: list[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2)

