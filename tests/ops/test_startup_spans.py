"""Start-up spans (issue 33): `imgfab smoke --log-dir` writes each container's whole log with the
container's start as its first line, and bench/startup.py's spans count from that line, so the
seconds before the entrypoint's first output (Triton's seed, the probe) are a span of their own."""

from __future__ import annotations

import importlib.util
import sys

from conftest import REPO

from imgfab.ops import smoke


def _bench_startup():
    spec = importlib.util.spec_from_file_location("bench_startup", REPO / "bench" / "startup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_startup", module)
    spec.loader.exec_module(module)
    return module


class _Engine:
    def __init__(self, started: str):
        self.started = started

    def container_logs(self, container, *, tail, timestamps):
        assert tail is None and timestamps
        return ("2026-12-06T07:00:04.000000000Z probe: exit 0 (this host runs this image)\n"
                "2026-12-06T07:00:10.500000000Z INFO vLLM API server version 0.26.0\n")

    def container_started_at(self, container):
        return self.started


def test_the_log_starts_with_the_containers_start(tmp_path):
    report = smoke.SmokeReport(base_url="http://127.0.0.1:8000", shape="runsh")
    smoke._write_log(_Engine("2026-12-06T07:00:00.250000000Z"), object(), str(tmp_path), report)
    lines = (tmp_path / "runsh.log").read_text().splitlines()
    assert lines[0] == "2026-12-06T07:00:00.250000000Z imgfab-smoke: the container's process started"
    assert lines[1].endswith("probe: exit 0 (this host runs this image)") and len(lines) == 3


def test_no_start_time_leaves_the_log_as_the_engine_wrote_it(tmp_path):
    report = smoke.SmokeReport(base_url="http://127.0.0.1:8000", shape="compose")
    smoke._write_log(_Engine(""), object(), str(tmp_path), report)
    assert (tmp_path / "compose.log").read_text().startswith("2026-12-06T07:00:04.000000000Z probe: exit 0")


def test_spans_count_the_probe_from_the_containers_start():
    log = ("2026-12-06T07:00:00.250000000Z imgfab-smoke: the container's process started\n"
           "2026-12-06T07:00:04.000000000Z PASS driver: driver 580.159.04\n"
           "2026-12-06T07:00:04.050000000Z probe: exit 0 (this host runs this image)\n"
           "2026-12-06T07:00:10.550000000Z INFO vLLM API server version 0.26.0\n"
           "2026-12-06T07:00:20.050000000Z INFO Resolved architecture: Qwen2ForCausalLM\n"
           "2026-12-06T07:00:31.050000000Z INFO Application startup complete.\n")
    assert _bench_startup().spans(log) == [
        {"landmark": "probe reported (seed, probe)", "at_s": 3.8, "span_s": 3.8},
        {"landmark": "vLLM imported, server starting", "at_s": 10.3, "span_s": 6.5},
        {"landmark": "architecture resolved", "at_s": 19.8, "span_s": 9.5},
        {"landmark": "serving", "at_s": 30.8, "span_s": 11.0},
    ]
