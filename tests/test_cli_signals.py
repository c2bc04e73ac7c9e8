"""SIGTERM and SIGHUP clean up as SIGINT does (issue 21), tested with real signals.

``python -m imgfab.cli``-equivalent runs as a child process (a driver that replaces the
engine's SDK calls with recorders, then calls :func:`imgfab.cli.main`). The docker CLI is a
fake script: it records its pid, marks the tags as applied (what the daemon does when the
export ends) and waits on a ``sleep`` child, so that the signal lands in the middle of
``docker build``. After the signal: no ``imgfab-secrets-*`` directory (pip.conf holds the
password) in the child's TMPDIR, the fake docker and its ``sleep`` are dead, the tags the build
moved are removed, and the exit code is ``128 + signum``. ``render -o`` is stopped while it
writes its staging directory, which must be gone afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, RECIPES

RECIPE = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")
PASSWORD = "hunter2-Pa55word"
SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]

# The engine's SDK calls, recorded: a tag names the fake image once the fake docker has
# written `tagged` (or the `before` image when the test says a previous build made it).
DRIVER = textwrap.dedent('''
    import os, signal, sys
    # A shell's background job inherits SIGINT ignored, and Python then installs no
    # KeyboardInterrupt for it: the driver runs as a terminal's foreground command would.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from pathlib import Path
    from imgfab.docker import engine
    from imgfab.errors import EngineError

    state = Path(os.environ["SIG_STATE"])

    def inspect_image(ref):
        if (state / "tagged").exists():
            return {"Id": "sha256:" + "b" * 64, "Size": 1}
        if (state / "before").exists():
            return {"Id": "sha256:" + "a" * 64, "Size": 1}
        raise EngineError(f"inspect {ref}: image not found")

    def remove_image(ref, force=False):
        with open(state / "removed", "a") as handle:
            handle.write(ref + "\\n")

    engine.inspect_image = inspect_image
    engine.remove_image = remove_image
    engine.check_engine = lambda compression, facts=None: None  # no engine behind the fake CLI
    {pause}
    from imgfab.cli import main
    sys.argv = ["imgfab", *sys.argv[1:]]
    main()
''')

FAKE_DOCKER = textwrap.dedent('''\
    #!/bin/sh
    if [ "$1 $2" = "build --help" ]; then echo "--secret"; exit 0; fi
    echo $$ > "$SIG_STATE/docker.pid"
    {tag}
    sleep 300 &
    echo $! > "$SIG_STATE/sleep.pid.partial"
    mv "$SIG_STATE/sleep.pid.partial" "$SIG_STATE/sleep.pid"
    wait
''')

# render -o: pause inside write_context, once the staging directory holds the Dockerfile.
PAUSE_IN_STAGING = textwrap.dedent('''
    import pathlib, time
    real_write_text = pathlib.Path.write_text
    def write_text(self, *args, **kwargs):
        written = real_write_text(self, *args, **kwargs)
        if self.name == "Dockerfile" and self.parent.name.startswith("."):
            real_write_text(state / "paused", str(self))
            time.sleep(300)
        return written
    pathlib.Path.write_text = write_text
''')


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no container init reaps counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"imgfab exited {process.returncode} before {path.name}: {err[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {path.name} after {seconds}s")
        time.sleep(0.05)


def _start(tmp_path: Path, args: list[str], *, pause: str = "", tag: bool = True,
           before: bool = False) -> tuple[subprocess.Popen, Path, Path]:
    state, scratch = tmp_path / "state", tmp_path / "tmp"
    state.mkdir()
    scratch.mkdir()
    if before:
        (state / "before").write_text("a previous build's image")
    docker = tmp_path / "docker"
    # the state directory written into the script: the docker CLI inherits no SIG_STATE (its
    # environment is an allow-list, issue 34)
    docker.write_text(FAKE_DOCKER.replace("{tag}", 'touch "$SIG_STATE/tagged"' if tag else ":")
                      .replace('"$SIG_STATE/', f'"{state}/'))
    docker.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.replace("{pause}", pause))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env.update(SIG_STATE=str(state), TMPDIR=str(scratch), XDG_CACHE_HOME=str(tmp_path / "cache"),
               IMGFAB_DOCKER_CLI=str(docker), PYTHONPATH=os.pathsep.join(
                   [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    # SIGHUP at its default, explicitly: a test run started under nohup passes SIG_IGN on to
    # its children, and imgfab rightly keeps an inherited SIG_IGN (test_sighup_stays_ignored_
    # under_nohup), so without this the SIGHUP cases would wait for a signal that never lands.
    process = subprocess.Popen([sys.executable, str(driver), *args], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_sighup)
    return process, state, scratch


def _default_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _build_args(tmp_path: Path) -> list[str]:
    return ["build", str(RECIPE), "-o", str(tmp_path / "ctx"), "--registry", "reg.example:5000",
            "--pip-index-url", f"https://ci:{PASSWORD}@pypi.corp.example/simple"]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_signal_during_docker_build_cleans_up(tmp_path, signum):
    process, state, scratch = _start(tmp_path, _build_args(tmp_path))
    _wait_for(state / "sleep.pid", process)
    assert list(scratch.glob("imgfab-secrets-*/pip.conf")), "the build runs with its pip.conf"
    docker_pid = int((state / "docker.pid").read_text())
    sleep_pid = int((state / "sleep.pid").read_text())
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert not list(scratch.glob("imgfab-secrets-*")), "pip.conf (with the password) left behind"
    assert not _alive(docker_pid), "the docker CLI kept running"
    assert not _alive(sleep_pid), "the docker CLI's child kept running"
    assert process.returncode == 128 + signum, err
    removed = sorted((state / "removed").read_text().split())
    assert len(removed) == 2 and removed[1] == f"reg.example:5000/{removed[0]}", removed
    lines = err.strip().splitlines()
    assert lines[-1] == f"imgfab: stopped by {signal.Signals(signum).name}", err
    assert "Traceback" not in err and PASSWORD not in err + out


def test_interrupted_build_keeps_the_tag_of_an_earlier_image(tmp_path):
    """The signal lands before the daemon tagged anything: the tags still name the image
    they named before this build, which stays named."""
    process, state, scratch = _start(tmp_path, _build_args(tmp_path), tag=False, before=True)
    _wait_for(state / "sleep.pid", process)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert not (state / "removed").exists()
    assert not list(scratch.glob("imgfab-secrets-*"))


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_signal_during_render_removes_the_staging_directory(tmp_path, signum):
    out_dir = tmp_path / "out" / "ctx"
    process, state, _ = _start(tmp_path, ["render", str(RECIPE), "-o", str(out_dir)],
                               pause=PAUSE_IN_STAGING)
    _wait_for(state / "paused", process)
    staging = Path((state / "paused").read_text()).parent
    assert staging.is_dir() and staging.parent == out_dir.parent
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert list(out_dir.parent.iterdir()) == [], "a staging directory was left"
    assert process.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == f"imgfab: stopped by {signal.Signals(signum).name}"


def test_sighup_stays_ignored_under_nohup(tmp_path):
    """A process started ignoring SIGHUP (nohup) keeps ignoring it."""
    code = ("import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "from imgfab import interrupts; interrupts.install()\n"
            "assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN\n"
            "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
