"""The smoke client against a real OpenAI-compatible server generating on the GPU.

The server is tests/fixtures/openai_server.py with its ``transformers`` backend, serving a
tiny randomly initialised Llama built here (tests/fixtures/tiny_model.py): no hub download,
the GPU machine has no network. ``transformers serve`` was not used: it needs FastAPI and
uvicorn, which the GPU machine lacks.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from imgfab.ops import smoke

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        import torch
    except ImportError:
        pytest.fail("torch is not installed: run this test on the GPU machine")
    if not torch.cuda.is_available():
        pytest.fail("torch sees no CUDA device: run this test on the GPU machine")
    from tiny_model import build_tiny_llama

    model = build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    log = tmp_path_factory.mktemp("logs") / "server.log"
    proc = subprocess.Popen([sys.executable, str(FIXTURES / "openai_server.py"), "--port", "0",
                             "--backend", "transformers", "--model-path", str(model),
                             "--device", "cuda", "--model-id", "tiny-llama"],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    try:
        assert line.startswith("PORT "), f"server did not start: {line!r} {log.read_text()}"
        yield f"http://127.0.0.1:{line.split()[1]}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"\nserver log tail:\n{''.join(log.read_text().splitlines(True)[-5:])}")


def test_smoke_passes_against_a_model_generating_on_the_gpu(gpu_server):
    report = smoke.run_smoke(gpu_server, health_timeout_s=300, poll_interval_s=0.5,
                             completions=True, max_tokens=64)
    print(f"\n{report.to_json()}")
    print(f"smoke: passed={report.passed} ttft_ms={report.ttft_ms} "
          f"tokens_per_s={report.tokens_per_s} tokens={report.completion_tokens} "
          f"healthy_after_s={report.healthy_after_s:.1f} "
          f"peak_gpu_memory_MiB={[p // 2**20 for p in report.peak_gpu_memory_bytes]}")
    assert report.passed, report.failures
    assert report.model_ids == ["tiny-llama"]
    assert all(answer.strip() for answer in report.answers)
    assert report.ttft_ms is not None and report.ttft_ms > 0
    assert report.tokens_per_s is not None and report.tokens_per_s > 0
    assert report.peak_gpu_memory_bytes and max(report.peak_gpu_memory_bytes) > 0, report.notes
    health = requests.get(f"{gpu_server}/health", timeout=5).json()
    assert health["device"].startswith("cuda"), health
