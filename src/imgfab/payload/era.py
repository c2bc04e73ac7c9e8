"""The era of a lock: the upper date bound ``imgfab lock`` resolves under (uv ``--exclude-newer``).

A lock pins the backend and torch exactly and lets uv choose everything else. Unbounded, uv
chooses today's releases: a vLLM 0.8.5.post1 lock resolved in 2026 pinned transformers 5.20.2
and tokenizers 0.23.3, a pairing nobody has tested with that vLLM (the class of breakage of
runpod-workers/worker-vllm#258: vLLM 0.11 with transformers 5 fails on
``all_special_tokens_extended``). Bounded by the backend release's own upload time, uv picks
what was current when that release was made and tested.

The bound is a pure function of recorded data: ``uploaded`` of the backend's row in
``compat/vllm.yaml`` or ``compat/tensorrt_llm.yaml`` (the latest upload time of the release's
files, read from PyPI's JSON API by ``imgfab compat refresh``) plus :data:`GRACE`. So the same
recipe, matrix and lock give the same bound and a byte-identical lock, and ``lock --check``
(the bound is in :meth:`~imgfab.payload.lockfile.PayloadRequest.fingerprint` and in the
``# exclude-newer:`` header line it compares) notices when the matrix or the grace moves it.

>>> exclude_newer("2026-04-18T05:50:15Z")
'2026-05-02T05:50:15Z'
>>> era_line("vllm", "0.19.1", "2026-04-18T05:50:15Z")
'2026-05-02T05:50:15Z (vllm 0.19.1 uploaded 2026-04-18T05:50:15Z on PyPI, + 14 days grace)'
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

# Fourteen days after the release: the dependency fixes made in answer to a backend release
# (a transformers or tokenizers patch release for a model the release added, a huggingface-hub
# fix) land within days of it; the next minor releases of those libraries, which are what
# break an older backend (transformers 4 -> 5), come later. vLLM 0.8.5.post1 (uploaded
# 2025-05-02) + 14 days resolves transformers 4.51.3, the release it was tested with; vLLM
# patch releases themselves come 1 to 15 days apart (0.19.0 -> 0.19.1: 15 days), so a bound
# of two weeks rarely reaches past the backend's own next release.
GRACE = timedelta(days=14)

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def exclude_newer(uploaded: str) -> str:
    """The bound uv resolves under: ``uploaded`` (UTC, ``2026-04-18T05:50:15Z``) + :data:`GRACE`,
    in the same RFC 3339 form. Raises ValueError on another shape (the matrix loader refuses
    one before it gets here)."""
    moment = datetime.strptime(uploaded, _FORMAT).replace(tzinfo=timezone.utc)
    return (moment + GRACE).strftime(_FORMAT)


def era_line(backend: str, version: str, uploaded: str) -> str:
    """The ``# exclude-newer:`` header value: the bound and where it came from."""
    return (f"{exclude_newer(uploaded)} ({backend} {version} uploaded {uploaded} on PyPI, "
            f"+ {GRACE.days} days grace)")
