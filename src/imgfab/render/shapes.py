"""How each run artifact starts an image: the one description run.sh, compose.yaml, k8s.yaml
and ``imgfab smoke`` share.

Serving compiles code on its first start (Triton's launcher, FlashInfer's kernels, torch
Inductor's wrappers) and loads it from where it wrote it: :data:`CODE_PATHS`. Every shape must
let the image's user write *and execute* there, so a shape's tmpfs mounts carry ``exec``
(Docker mounts ``tmpfs`` ``noexec`` unless told otherwise). The compiled-kernel caches live
under :data:`JIT_CACHE`, which run.sh and compose.yaml keep in a named volume, so a restart
reuses what the first start compiled; Kubernetes keeps it in the pod's ``home`` emptyDir,
which survives container restarts (not a new pod).

:func:`shape` returns the container settings of one shape; the templates render the same
values (:func:`compose_tmpfs`), so what ``imgfab smoke`` starts is what the artifacts start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from imgfab.in_image import gate

HOME = "/home/imgfab"
# XDG_CACHE_HOME of the image: Hugging Face, vLLM (torch.compile), FlashInfer's JIT cache,
# and Triton's cache (TRITON_CACHE_DIR points here too).
JIT_CACHE = f"{HOME}/.cache"
TRITON_CACHE = f"{JIT_CACHE}/triton"
# Where serving writes code it then loads (dlopen / exec): torch Inductor works under /tmp.
CODE_PATHS = ("/tmp", HOME, JIT_CACHE)
SHAPES = ("runsh", "compose", "k8s")
# Where every shape mounts the API key file (a Docker secret's path, a k8s Secret's subPath):
# the entrypoint reads it into VLLM_API_KEY, and the in-image gate reads it in the server.
API_KEY_FILE = gate.API_KEY_FILE


def cache_volume(recipe_name: str) -> str:
    """The named volume run.sh and compose.yaml keep the JIT caches in."""
    return f"imgfab-{recipe_name}-cache"


def compose_tmpfs(uid: int) -> list[str]:
    """compose.yaml's ``tmpfs:`` entries (Docker's ``--tmpfs PATH:OPTIONS``): writable and
    executable, /tmp sticky for everyone, the home directory the image user's alone."""
    return ["/tmp:exec,mode=1777", f"{HOME}:exec,uid={uid},gid={uid},mode=0700"]


@dataclass(frozen=True)
class Shape:
    """Container settings of one run shape, as ``docker run`` options.

    ``volumes``: ``(source, target)``; source None is an anonymous volume (an emptyDir),
    a name is a named volume. ``tmpfs``: target → mount options.
    """

    name: str
    description: str
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)
    volumes: tuple[tuple[str | None, str], ...] = ()
    cap_drop: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    user: str | None = None
    group_add: tuple[str, ...] = ()


def shape(name: str, *, uid: int, cache: str | None) -> Shape:
    """The settings of shape ``name`` (one of :data:`SHAPES`) for an image whose user is
    ``uid``; ``cache`` names the JIT cache volume (None: an anonymous one)."""
    if name == "runsh":
        return Shape("runsh", "run.sh: writable root, the JIT cache in a named volume",
                     volumes=((cache, JIT_CACHE),))
    if name == "compose":
        tmpfs = dict(entry.split(":", 1) for entry in compose_tmpfs(uid))
        return Shape("compose", "compose.yaml: read-only root, exec tmpfs for /tmp and the home, "
                     "the JIT cache in a named volume", read_only=True, tmpfs=tmpfs,
                     volumes=((cache, JIT_CACHE),))
    if name == "k8s":
        return Shape("k8s", "k8s.yaml: read-only root, emptyDir-like volumes for /tmp and the home, "
                     "all capabilities dropped, no privilege escalation, runAsUser/fsGroup",
                     read_only=True, volumes=((None, "/tmp"), (None, HOME)), cap_drop=("ALL",),
                     security_opt=("no-new-privileges",), user=f"{uid}:{uid}",
                     group_add=(str(uid),))
    raise ValueError(f"unknown run shape {name!r}: one of {', '.join(SHAPES)}")


def noexec_code_paths(mounts: str) -> list[str]:
    """The :data:`CODE_PATHS` that ``/proc/mounts`` text shows mounted ``noexec`` (the mount
    that covers each path is the last listed one whose mount point is it or a parent)."""
    entries = []
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            entries.append((parts[1].replace("\\040", " "), parts[3].split(",")))
    bad = []
    for path in CODE_PATHS:
        best: tuple[str, list[str]] | None = None
        for point, opts in entries:  # a later mount on the same point hides the earlier one
            if (path == point or path.startswith(point.rstrip("/") + "/")) and (
                    best is None or len(point) >= len(best[0])):
                best = (point, opts)
        if best is not None and "noexec" in best[1]:
            bad.append(path)
    return bad
