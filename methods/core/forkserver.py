"""Start the pipeline's jobs from a warm process that has already imported torch and transformers.

Every job of the pipeline is a fresh ``python -m methods.cli ...``.  On the 2-core reference
machine importing torch and transformers takes about 10 s, and a smoke-profile training job does
about 2 s of work, so the smoke pipeline's 41 jobs spent most of their time importing
(docs/decisions.md, "Job start").  The rules therefore run

    python -m methods.core.forkserver methods.cli train --job ...

This client imports only the standard library.  It connects to a server, one per interpreter,
repository and environment, listening on a Linux abstract socket, and starts one if there is
none.  It hands over its arguments, working directory, environment and standard streams (their
file descriptors, over the socket).  The server forks a child that runs the module as
``python -m`` would, with the client's streams, and the client waits for the child and exits
with its status.  Signals that reach the client (Snakemake cancelling a job) are forwarded to
the child; a child whose client disappears is terminated, and so is one whose server dies (its
client then exits with status 1).

- **Preloaded:** only third-party libraries.  The server never imports the suite's own modules
  (beyond this one), so each child imports them fresh and an edit takes effect at the next job.
- **Nothing computed in the server:** no torch op runs there, so no thread pool exists when it
  forks.  Each child reseeds ``random`` from the OS as a fresh interpreter would, and sets its
  own torch threads (``--threads``).
- **Exit:** the child joins its threads, runs its atexit handlers and flushes its streams as the
  interpreter would, then skips the module teardown (1.2 s with torch loaded).
- **Idle exit:** the server exits after :data:`IDLE_S` seconds with no job running.
- **Same results either way:** a job forked from the server writes the same metrics as the same
  job run directly (``tests/test_forkserver.py``).  Where the server cannot be used (not Linux,
  ``LOPD_FORKSERVER=0``, inside a SLURM job, whose allocation would take a server it started
  down with it, or no server listening within :data:`START_TIMEOUT_S` seconds) the client
  replaces itself with ``python -m <module>``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

#: seconds the server stays up with no job running (LOPD_FORKSERVER_IDLE_S overrides it)
IDLE_S = 120.0
#: seconds a client waits for a server it started to listen (it imports torch and transformers)
START_TIMEOUT_S = 90.0
#: what the server imports before it forks: the third-party libraries every job needs
PRELOAD = (
    "torch",
    "numpy",
    "tokenizers",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.tokenization_utils_tokenizers",
)
_HEADER = struct.Struct("!I")
#: environment variables that differ between shells without changing what a job computes
_VOLATILE_ENV = ("PWD", "OLDPWD", "SHLVL", "_")


def _key(env: dict[str, str]) -> str:
    """The server a client may use: same interpreter, same checkout of the suite, same environment,
    same version of this file (a server started by older code is not reused)."""
    h = hashlib.sha256()
    for part in (sys.executable, str(Path(__file__).resolve()), Path(__file__).read_bytes().hex()):
        h.update(part.encode() + b"\0")
    for k in sorted(env):
        if k not in _VOLATILE_ENV:
            h.update(f"{k}={env[k]}".encode() + b"\0")
    return h.hexdigest()[:20]


def _address(key: str) -> str:
    return f"\0lopd-bench-forkserver-{key}"  # abstract namespace: no file, gone when the server exits


def _send(sock: socket.socket, obj, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    msg = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [msg], fds)
    else:
        sock.sendall(msg)


def _recv_exact(sock: socket.socket, n: int, first: bytes = b"") -> bytes:
    buf = bytearray(first)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, with_fds: int = 0):
    if with_fds:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, with_fds)
    else:
        data, fds = sock.recv(_HEADER.size), []
    if not data:
        raise ConnectionError("connection closed")
    head = _recv_exact(sock, _HEADER.size, data[: _HEADER.size])
    (n,) = _HEADER.unpack(head)
    body = _recv_exact(sock, n, data[_HEADER.size :])
    return json.loads(body), fds


# --- client -------------------------------------------------------------------------------------
def _direct(module: str, args: list[str]) -> NoReturn:
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def _connect(address: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        return sock
    except OSError:
        sock.close()
        return None


def _start_server(key: str) -> subprocess.Popen:
    log = Path(tempfile.gettempdir()) / f"lopd-bench-forkserver-{key}.log"
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "methods.core.forkserver", "--serve", key],
            cwd=str(Path(__file__).resolve().parents[2]),
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            start_new_session=True,  # outlives this job; not in the job's process group
        )


def run(module: str, args: list[str]) -> int:
    """Run ``python -m module args`` through the server; returns the job's exit status."""
    if sys.platform != "linux" or os.environ.get("LOPD_FORKSERVER", "1") == "0" or "SLURM_JOB_ID" in os.environ:
        _direct(module, args)  # a cluster job's server would die with the allocation that started it
    env = dict(os.environ)
    key = _key(env)
    sock = _connect(_address(key))
    if sock is None:
        server = _start_server(key)
        deadline = time.monotonic() + START_TIMEOUT_S
        while sock is None and time.monotonic() < deadline:
            time.sleep(0.05)
            sock = _connect(_address(key))
            if sock is None and server.poll() is not None:  # it exited: another one won the address, or it failed
                deadline = min(deadline, time.monotonic() + 1.0)
        if sock is None:
            print(
                f"forkserver: no server to run {module} (see its log in {tempfile.gettempdir()}); running it directly",
                file=sys.stderr,
            )
            _direct(module, args)
    assert sock is not None  # connected, or _direct replaced this process
    # Signals go to the job. The handlers are in place before the job can start, and a signal that
    # comes before the server has said the job's pid waits for it: the job may already be running
    # (and printing) while the reply is on its way.
    job: dict = {"pid": None, "pending": []}

    def forward(signum, frame):
        if job["pid"] is None:
            job["pending"].append(signum)
            return
        try:
            os.kill(job["pid"], signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    with sock:
        for s in (sys.stdout, sys.stderr):
            s.flush()
        _send(sock, {"module": module, "args": args, "cwd": os.getcwd(), "env": env}, [0, 1, 2])
        try:
            reply, _ = _recv(sock)
        except (ConnectionError, OSError):  # no job was started: running it here runs it once
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            for sig in job["pending"]:  # asked to stop before anything ran: stop as the signal would
                os.kill(os.getpid(), sig)
            print(f"forkserver: the server went away before starting {module}; running it directly", file=sys.stderr)
            _direct(module, args)
        job["pid"] = reply["pid"]
        for sig in job["pending"]:
            forward(sig, None)
        try:
            reply, _ = _recv(sock)
        except ConnectionError:
            print("forkserver: the server exited while the job ran", file=sys.stderr)
            return 1
    return int(reply["status"])


# --- server -------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """SIGTERM this process when the server dies (Linux's PR_SET_PDEATHSIG): a job whose server is
    gone has lost its client's status channel, and must not go on writing outputs unobserved."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(request: dict, fds: list[int], keep: list) -> int:
    """In the forked child: run ``python -m module`` with the client's streams and directory; returns
    its exit status."""
    try:
        for obj in keep:
            obj.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1 if unbuffered or os.isatty(1) else -1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # what `python -m` puts first
        import random

        random.seed()  # a fresh interpreter's state, not the server's
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import runpy

        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def _exit(code: int) -> None:
    """End the child as the interpreter ends: join its threads, run its atexit handlers, flush its
    streams; then leave without tearing down the modules, which takes 1.2 s with torch and
    transformers loaded (a job's files are closed by then: the suite writes through ``with``)."""
    try:
        main_thread = threading.main_thread()
        for t in threading.enumerate():
            if t is not main_thread and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass
    finally:
        os._exit(code)


def serve(key: str) -> None:
    """Preload, listen on the key's address and fork a child per request until idle."""
    idle_s = float(os.environ.get("LOPD_FORKSERVER_IDLE_S", IDLE_S))
    t0 = time.perf_counter()
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as e:  # a job imports what it needs itself; the server only saves it time
            print(f"forkserver {key}: not preloaded: {name} ({e})", file=sys.stderr, flush=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_address(key))
    except OSError:
        return  # another client started one first
    listener.listen(64)
    print(f"forkserver {key}: ready after {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    jobs: dict[int, socket.socket] = {}  # child pid -> its client's connection
    last = time.monotonic()
    while True:
        for event, _ in sel.select(timeout=0.1):
            sock = event.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                conn.settimeout(10.0)  # a client sends its request at once; one that does not is dropped
                try:
                    request, fds = _recv(conn, with_fds=3)
                except (ConnectionError, OSError, ValueError):
                    conn.close()
                    continue
                conn.settimeout(None)
                pid = os.fork()
                if pid == 0:
                    _exit(_child(request, fds, [sel, listener, conn, *jobs.values()]))
                for fd in fds:
                    os.close(fd)
                jobs[pid] = conn
                _send(conn, {"pid": pid})
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a client went away (it only ever waits): stop its job
                try:
                    os.kill(event.data, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                sel.unregister(sock)
        while jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            finished = jobs.pop(pid) if pid in jobs else None
            if finished is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            try:
                _send(finished, {"status": code if code >= 0 else 128 - code})
            except OSError:
                pass
            try:
                sel.unregister(finished)
            except KeyError:  # its client had gone already
                pass
            finished.close()
        if jobs:
            last = time.monotonic()
        elif time.monotonic() - last > idle_s:
            print(f"forkserver {key}: idle for {idle_s:.0f} s, exiting", file=sys.stderr, flush=True)
            return


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"] and len(argv) == 2:
        serve(argv[1])
        return
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        print("usage: python -m methods.core.forkserver <module> [args...]", file=sys.stderr)
        raise SystemExit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    raise SystemExit(run(argv[0], argv[1:]))


if __name__ == "__main__":
    main()
