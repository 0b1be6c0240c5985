"""Jobs started through the fork server (methods/core/forkserver.py) behave as `python -m` would:
arguments, directory, environment, streams and exit status pass through, a signal to the client
stops the job, and a training run writes the same metrics either way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from .conftest import tiny_configs

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server listens on a Linux abstract socket")

PROBE = """
import os, sys, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
                  "pid": os.getpid(), "ppid": os.getppid()}), flush=True)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    time.sleep(60)
raise SystemExit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    """The environment of this module's jobs: its own server (the environment is part of the
    server's key), shared by the tests here and gone 10 s after its last job."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LOPD_FORKSERVER_IDLE_S": "10",
        "PROBE": "x",
        "FORKSERVER_TEST": uuid.uuid4().hex,
    }


def _client(tmp_path: Path, env: dict, *args: str, **kw):
    (tmp_path / "probe_mod.py").write_text("import json\n" + PROBE)
    cmd = [sys.executable, "-m", "methods.core.forkserver", "probe_mod", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, **kw)


def _sleeping_job(tmp_path: Path, env: dict) -> tuple[subprocess.Popen, dict]:
    """A client running a job that sleeps, and the job's own report (its pid and its parent's)."""
    (tmp_path / "probe_mod.py").write_text("import json\n" + PROBE)
    client = subprocess.Popen(
        [sys.executable, "-m", "methods.core.forkserver", "probe_mod", "sleep"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return client, json.loads(client.stdout.readline())


def _ends(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    return not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_arguments_directory_environment_streams_and_status_pass_through(tmp_path, env):
    first = _client(tmp_path, env, "3")
    second = _client(tmp_path, env, "0")
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert first.returncode == 3 and second.returncode == 0
    assert a["argv"] == ["3"] and a["cwd"] == str(tmp_path) and a["probe"] == "x"
    assert first.stderr.endswith("to stderr\n") and second.stderr.endswith("to stderr\n")
    # both ran as children of one server: the second reused the server the first started
    assert a["ppid"] == b["ppid"] and a["pid"] != b["pid"]


def test_without_the_server_the_client_becomes_the_job(tmp_path, env):
    res = _client(tmp_path, {**env, "LOPD_FORKSERVER": "0"}, "4")
    job = json.loads(res.stdout)
    assert res.returncode == 4 and job["argv"] == ["4"] and job["ppid"] == os.getpid()  # our own child, no server


def test_a_signal_to_the_client_stops_the_job(tmp_path, env):
    client, job = _sleeping_job(tmp_path, env)
    assert job["ppid"] != client.pid  # forked by the server, not the client's own process
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == 128 + signal.SIGTERM
    assert _ends(job["pid"])


@pytest.mark.slow
def test_a_training_run_writes_the_same_metrics_through_the_server(warmstarts, tmp_path, env):
    """The same job, forked from the server and run as a fresh interpreter: identical metrics."""
    model, ws, train = tiny_configs()
    job = {
        "profile": "test",
        "domain": "tooluse",
        "task_seed": 0,
        "domain_options": {},
        "model": asdict(model),
        "warmstart": asdict(ws),
        "train": asdict(train),
        "method": "grpo",
        "method_config": {"group_size": 4},
    }
    ws_path, _ = warmstarts["tooluse"]
    runs = {}
    for how in ("forked", "direct"):
        out = tmp_path / how
        cmd = ["methods.cli", "train", "--job", json.dumps(job), "--seed", "0", "--warmstart", str(ws_path)]
        cmd += ["--out", str(out), "--threads", "1"]
        env_how = {**env, "LOPD_FORKSERVER": "1" if how == "forked" else "0"}
        res = subprocess.run(
            [sys.executable, "-m", "methods.core.forkserver", *cmd],
            cwd=ROOT,
            env=env_how,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[how] = [{k: v for k, v in r.items() if not k.endswith("_s")} for r in lines]
    assert runs["forked"] == runs["direct"] and len(runs["direct"]) >= 3


def test_a_job_stops_when_its_server_dies(tmp_path, env):
    """A job whose server is killed is stopped (it has lost its status channel), and its client
    reports a failure instead of hanging."""
    own = {**env, "FORKSERVER_TEST": uuid.uuid4().hex}  # a server of its own: this test kills it
    client, job = _sleeping_job(tmp_path, own)
    server = Path(f"/proc/{job['ppid']}/cmdline").read_bytes().split(b"\0")
    assert b"--serve" in server and job["ppid"] != os.getpid()  # never kill anything but the job's server
    os.kill(job["ppid"], signal.SIGKILL)
    assert client.wait(timeout=30) == 1
    assert _ends(job["pid"])


def test_a_server_that_fails_to_start_leaves_the_job_to_run_directly(tmp_path, env):
    broken = {**env, "FORKSERVER_TEST": uuid.uuid4().hex, "LOPD_FORKSERVER_IDLE_S": "not a number"}
    t0 = time.monotonic()
    res = _client(tmp_path, broken, "5")
    assert res.returncode == 5 and json.loads(res.stdout)["argv"] == ["5"]
    assert "running it directly" in res.stderr
    assert time.monotonic() - t0 < 60  # not the 90 s a client waits for a server that is still starting


def test_a_signal_before_the_server_names_the_job_reaches_the_job(tmp_path):
    """The job can start (and print) before the server's reply with its pid reaches the client; a
    signal in that window is held and forwarded once the pid is known, not lost with the client.
    A stand-in server controls the window: it replies only after the client was signalled."""
    import socket

    from methods.core import forkserver as fs

    env = {**os.environ, "PYTHONPATH": str(ROOT), "FORKSERVER_TEST": uuid.uuid4().hex}
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(fs._address(fs._key(env)))  # where a client of this environment looks for its server
    server.listen(1)
    server.settimeout(60)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the "job" the server names
    client = subprocess.Popen(
        [sys.executable, "-m", "methods.core.forkserver", "json.tool"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        conn, _ = server.accept()
        request, fds = fs._recv(conn, with_fds=3)
        for fd in fds:
            os.close(fd)
        assert request["module"] == "json.tool"
        client.send_signal(signal.SIGTERM)  # the request is sent, the job's pid not yet known to the client
        time.sleep(0.5)
        assert client.poll() is None  # held, not fatal
        fs._send(conn, {"pid": job.pid})
        assert job.wait(timeout=10) == -signal.SIGTERM  # forwarded as soon as the pid came
        fs._send(conn, {"status": 128 + signal.SIGTERM})
        assert client.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        for proc in (job, client):
            if proc.poll() is None:
                proc.kill()
        server.close()
