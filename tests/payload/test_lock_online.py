"""``imgfab lock --check --online`` against a loopback index (issue 21, item 1).

The index is a tiny http.server serving, for each name the committed lock pins, a PEP 691
JSON page or a PEP 503 HTML page (alternately) listing files of that version with the lock's
hashes; the forged cases change one of them. Offline, a consistent forgery passes --check
(everything in the fingerprint is public); online it is refused naming the package and line.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imgfab.errors import NetworkError
from imgfab.payload.lockparse import parse_lock

from conftest import REPO

RECIPE = "qwen2-7b-h100"


def _pages(text: str) -> dict[str, tuple[str, bytes]]:
    pages = {}
    for number, entry in enumerate(parse_lock(text).entries):
        files = [(f"{entry.name.replace('-', '_')}-{entry.version}-py3-none-manylinux_2_28_x86_64.whl",
                  h.split(":", 1)[1]) for h in entry.hashes]
        files.append((f"{entry.name.replace('-', '_')}-0.0.1-py3-none-any.whl", "1" * 64))  # another version
        if number % 2:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": entry.name,
                               "files": [{"filename": f, "url": f"../../files/{f}", "hashes": {"sha256": h}}
                                         for f, h in files]}).encode()
            pages[f"/simple/{entry.name}/"] = ("application/vnd.pypi.simple.v1+json", body)
        else:
            links = "".join(f'<a href="../../files/{f}#sha256={h}">{f}</a><br/>' for f, h in files)
            pages[f"/simple/{entry.name}/"] = ("text/html", f"<html><body>{links}</body></html>".encode())
    return pages


class _Index:
    def __init__(self, pages: dict[str, tuple[str, bytes]]):
        self.pages = pages
        self.trickle: set[str] = set()
        self.status: dict[str, int] = {}
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                if self.path in index.status:
                    self.send_response(index.status[self.path])
                    self.end_headers()
                    return
                page = index.pages.get(self.path)
                if page is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", page[0])
                if self.path not in index.trickle:
                    self.send_header("Content-Length", str(len(page[1])))
                self.end_headers()
                if self.path in index.trickle:
                    for byte in page[1][:40]:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                self.wfile.write(page[1])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def index():
    served = _Index(_pages((REPO / "recipes" / f"{RECIPE}.lock").read_text()))
    yield served
    served.server.shutdown()


def _check(*extra: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", "--check", "--online", *extra],
                          capture_output=True, text=True, cwd=cwd)


def test_every_pinned_hash_matching_the_index_passes(index):
    result = _check(str(REPO / "recipes" / f"{RECIPE}.yaml"), "--index-url", index.url)
    assert result.returncode == 0, result.stderr
    total = sum(len(e.hashes) for e in parse_lock((REPO / "recipes" / f"{RECIPE}.lock").read_text()).entries)
    assert f"lock current; {total} hashes match the index" in result.stdout


def _forge_page(index: _Index, name: str, mutate) -> None:
    kind, body = index.pages[f"/simple/{name}/"]
    index.pages[f"/simple/{name}/"] = (kind, mutate(body))


def test_a_hash_the_index_does_not_list_is_refused_naming_package_and_line(index):
    """The lock pins six's hash, the index lists another for that version: a forged lock (or
    a forged index) is refused, exit 2, one line."""
    text = (REPO / "recipes" / f"{RECIPE}.lock").read_text()
    six = next(e for e in parse_lock(text).entries if e.name == "six")
    _forge_page(index, "six", lambda body: body.replace(six.hashes[0].split(":")[1].encode(), b"f" * 64))
    result = _check(str(REPO / "recipes" / f"{RECIPE}.yaml"), "--index-url", index.url)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"{RECIPE}.lock: six 1.17.0 (line {six.line}) pins sha256:4721f391ed90…" in result.stderr


def test_a_version_the_index_does_not_have_is_refused(index):
    _forge_page(index, "attrs", lambda body: body.replace(b"attrs-", b"attrs-9"))
    del index.pages["/simple/six/"]  # and a name the index does not have at all (404)
    result = _check(str(REPO / "recipes" / f"{RECIPE}.yaml"), "--index-url", index.url)
    assert result.returncode == 2 and "is not on" in result.stderr and "(and 1 more)" in result.stderr, result.stderr


def test_a_consistent_offline_forgery_is_caught_online(tmp_path, index):
    """The forger edits a hash and recomputes the fingerprint: offline --check passes (it can
    only prove the file is as some imgfab wrote it), online it is refused."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.payload import lock as lockmod
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe = tmp_path / f"{RECIPE}.yaml"
    shutil.copyfile(REPO / "recipes" / f"{RECIPE}.yaml", recipe)
    text = (REPO / "recipes" / f"{RECIPE}.lock").read_text().replace(
        "--hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274", "--hash=sha256:" + "d" * 64)
    parsed = load_recipe(recipe)
    request = lockmod.payload_request(parsed, resolve(parsed, load_matrix()).stack)
    old = parse_lock(text).first("fingerprint")
    (tmp_path / f"{RECIPE}.lock").write_text(text.replace(old, lockmod.lock_fingerprint(request, text), 1))
    offline = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", "--check", str(recipe)],
                             capture_output=True, text=True)
    assert offline.returncode == 0, offline.stderr
    result = _check(str(recipe), "--index-url", index.url)
    assert result.returncode == 2 and "six 1.17.0" in result.stderr, result.stderr


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_index_is_an_environment_failure_without_the_password():
    url = f"http://alice:S3CRET@127.0.0.1:{_closed_port()}/simple"
    result = _check(str(REPO / "recipes" / f"{RECIPE}.yaml"), "--index-url", url)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "did not answer" in result.stderr
    assert "S3CRET" not in result.stderr and "Traceback" not in result.stderr


def test_an_index_error_is_an_environment_failure(index):
    index.status["/simple/six/"] = 503
    result = _check(str(REPO / "recipes" / f"{RECIPE}.yaml"), "--index-url", index.url)
    assert result.returncode == 1 and "HTTP 503" in result.stderr, result.stderr


def test_a_page_over_the_cap_is_refused_whether_announced_or_not(index):
    from imgfab.payload import online

    index.pages["/simple/big/"] = ("text/html", b"<a>" * 100_000)
    with pytest.raises(NetworkError, match="announced 300000 bytes"):
        online.index_files(index.url, "big", max_bytes=1000)
    index.trickle.add("/simple/big/")  # no Content-Length: counted as it arrives
    with pytest.raises(NetworkError, match="more than the 10 bytes"):
        online.index_files(index.url, "big", max_bytes=10)


def test_a_trickling_index_is_given_up_on_at_the_deadline(index):
    from imgfab.payload import online

    index.trickle.add("/simple/six/")  # one byte every 0.1 s: no single read times out
    with pytest.raises(NetworkError, match="took over"):
        online.index_files(index.url, "six", deadline=0.5)


def test_json_that_is_not_a_project_page_is_one_line(index):
    from imgfab.payload import online

    index.pages["/simple/odd/"] = ("application/vnd.pypi.simple.v1+json", b"<html>")
    with pytest.raises(NetworkError, match="not a PEP 691 project page"):
        online.index_files(index.url, "odd")
    index.pages["/simple/odd/"] = ("application/vnd.pypi.simple.v1+json", b'{"files": 3}')
    with pytest.raises(NetworkError, match="not a PEP 691 project page"):
        online.index_files(index.url, "odd")


def test_online_needs_check():
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", "--online",
                             str(REPO / "recipes" / f"{RECIPE}.yaml")], capture_output=True, text=True)
    assert result.returncode == 2 and "--online" in result.stderr


def test_every_building_job_checks_the_lock_online_before_it_builds():
    import yaml

    from imgfab.render.ci import Install, github_workflow

    workflow = yaml.safe_load(github_workflow(install=Install(path=".")))
    building = {name: job for name, job in workflow["jobs"].items()
                if any("imgfab build" in step.get("run", "") for step in job["steps"])}
    assert building
    for name, job in building.items():
        runs = [step.get("run", "") for step in job["steps"]]
        check = runs.index('imgfab lock --check --online "$RECIPE"')
        assert check < next(i for i, run in enumerate(runs) if "imgfab build" in run), name
        assert job["steps"][check]["env"] == {"RECIPE": "${{ matrix.recipe }}"}
