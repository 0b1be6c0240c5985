"""Isolated execution of untrusted generated Python programs.

The code domain runs thousands of model-written programs per training step, so
isolation has to be both strong and cheap.  The design is a **worker pool**:
``Sandbox`` starts N long-lived worker interpreters (this file run as a script,
stdlib only, common modules pre-imported).  For every program a worker forks a
fresh child from its already-warm interpreter (about a millisecond), confines
it, lets it run the test calls and reports back over pipes.  A worker that dies
is noticed and restarted; the program it was running is reported as failed.

Isolation layers, outermost first, and why each exists:

* **separate process per program** -- a crash, ``os._exit`` or corrupted
  interpreter state only takes down the throw-away child;
* **own process group + wall-clock timeout** -- the worker SIGKILLs the whole
  group when the deadline passes (``time.sleep`` loops, blocked reads);
* **rlimits** -- ``RLIMIT_CPU`` stops busy loops even when the wall clock is
  generous, ``RLIMIT_AS`` turns memory bombs into ``MemoryError``,
  ``RLIMIT_FSIZE`` bounds files written in the temp dir, ``RLIMIT_NPROC`` = 0
  stops fork bombs and ``RLIMIT_CORE`` = 0 avoids core dumps;
* **privilege drop** -- when running as root, RLIMIT_NPROC does not bind and
  every file is writable, so the child switches to ``nobody`` (it cannot signal
  the root-owned worker or write root-owned files).  The stdlib may live in a
  directory ``nobody`` cannot reach (``/root/...``), so the worker pre-imports
  every stdlib extension module (``lib-dynload``) and the child keeps a
  read-only descriptor of the stdlib directory, opened before the drop, through
  which :class:`_StdlibFinder` loads pure-Python stdlib modules: a correct
  program may import any stdlib module that is not blocked;
* **network namespace** -- each worker calls ``unshare(CLONE_NEWNET)`` once at
  start (silently skipped if not permitted), so children have no interfaces;
* **audit hook** (``sys.addaudithook``) -- refuses sockets, ctypes, process
  creation (fork/exec/spawn/system/subprocess), signalling (os.kill/killpg),
  raising rlimits, links, importing those modules, and opening or changing
  files outside the child's private temp dir (reads of the Python installation
  stay allowed for imports).  Audit hooks are a best-effort layer, not a
  security boundary on their own; the layers above are the hard walls;
* **private temp dir as cwd, scrubbed environment** -- no leaked secrets, no
  leftovers: the worker deletes the dir after the child is reaped;
* **capped output** -- stdout/stderr are drained by the worker and only the
  first ``max_output`` bytes are kept; a flood beyond a hard limit kills the
  child instead of buffering without bound;
* **trusted judging** -- the child never sees expected values.  It reports the
  ``repr`` of each return value (plain data types only, never user ``__repr__``
  or ``__eq__``), and the parent parses it with ``ast.literal_eval`` and
  compares with ``==``.  A program that forges result lines gains nothing.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import pickle
import select
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["ExecResult", "Sandbox", "default_sandbox"]

_HEADER = struct.Struct(">I")
_FLOOD_LIMIT = 1 << 20  # bytes of output after which the child is killed
_REPR_LIMIT = 4000  # longest return-value repr the child reports
_NOBODY = 65534
_CLONE_NEWNET = 0x40000000
_FSIZE_LIMIT = 1 << 20

#: Modules a program may not import (or reuse from the worker's sys.modules).
_BLOCKED_MODULES = frozenset(
    "ctypes _ctypes subprocess _posixsubprocess multiprocessing _multiprocessing "
    "socket _socket ssl _ssl pty asyncio concurrent".split()
)
#: Audit events refused outright (exact names or prefixes ending in '.').
_DENIED_EVENTS = (
    "socket.",
    "ctypes.",
    "subprocess.",
    "pty.",
    "os.fork",
    "os.forkpty",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.system",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "os.symlink",
    "os.link",
    "resource.setrlimit",
    "resource.prlimit",
)
#: Audit events whose path arguments must lie inside the temp dir.
_WRITE_PATH_EVENTS = frozenset(
    "os.remove os.rmdir os.mkdir os.rename os.truncate os.chmod os.chown os.utime "
    "os.chdir os.mkfifo os.mknod os.setxattr os.removexattr shutil.rmtree".split()
)
#: Audit events whose path argument must be readable (temp dir or installation).
_READ_PATH_EVENTS = frozenset("os.listdir os.scandir".split())
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PRELOAD = (
    "math cmath itertools collections functools re string heapq bisect operator copy random statistics fractions typing"
).split()


@dataclass
class ExecResult:
    """Outcome of one program on its tests.  ``reason`` is "ok" on success,
    otherwise e.g. "timeout", "memory", "syntax error: ...", or
    "failed test 2: f([1, 2]) returned 3, expected 4" (the text SDPO teachers see);
    ``failed_test`` is then that test's index (0-based), else None."""

    ok: bool
    passed: int
    total: int
    reason: str
    output: str
    failed_test: int | None = None


# =========================================================================== worker side
def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_frame(fd: int):
    head = _read_exact(fd, _HEADER.size)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _write_frame(fd: int, obj) -> None:
    _write_body(fd, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _write_body(fd: int, body: bytes) -> None:
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _unshare_network() -> None:
    """Move this worker (and so every child) into an empty network namespace."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)
    except Exception:
        pass  # not permitted here: the audit hook still refuses sockets
    gc.collect()  # free the CDLL's function pointers: children must not find one


#: lib-dynload extension modules never pre-imported (blocked ones aside): tests, GUIs, terminals.
_NO_PRELOAD_PREFIXES = ("_test", "_xx", "xx", "_tkinter", "readline", "_curses", "_ctypes_test")


def _extension_modules() -> list[str]:
    """Names of the stdlib's extension modules (``lib-dynload/*.so``) a program may import."""
    import importlib.machinery

    dynload = os.path.join(os.path.dirname(os.__file__), "lib-dynload")
    names = set()
    for entry in os.listdir(dynload) if os.path.isdir(dynload) else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if entry.endswith(suffix):
                names.add(entry[: -len(suffix)])
    return sorted(n for n in names if n not in _BLOCKED_MODULES and not n.startswith(_NO_PRELOAD_PREFIXES))


def _preload() -> None:
    """Import what programs commonly use, and every stdlib extension module: a child that runs
    as ``nobody`` can neither read nor ``dlopen`` files under a root-only directory."""
    import importlib.util  # noqa: F401  (_StdlibFinder's, imported now: never from inside an import)
    import warnings

    for name in _PRELOAD:
        __import__(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules (audioop, nis, ...) warn on import
        for name in _extension_modules():
            try:
                __import__(name)
            except ImportError:
                pass  # built without its library here: no program can import it either


class _StdlibFinder:
    """Loads pure-Python stdlib modules through a directory descriptor opened before the
    privilege drop, for a child whose user cannot reach the stdlib by path.  Installed only
    then; it reads (never writes: no bytecode cache) files the installation already exposes to
    imports, and the audit hook still refuses blocked modules."""

    def __init__(self, dir_fd: int, root: str):
        self.dir_fd, self.root = dir_fd, root

    def find_spec(self, name, path=None, target=None):
        from importlib.util import spec_from_file_location  # pre-imported by the worker

        rel = name.replace(".", "/")
        for candidate, package in ((rel + "/__init__.py", True), (rel + ".py", False)):
            try:
                os.stat(candidate, dir_fd=self.dir_fd)
            except OSError:
                continue
            origin = os.path.join(self.root, candidate)
            spec = spec_from_file_location(
                name,
                origin,
                loader=_FdSourceLoader(self.dir_fd, candidate, origin),
                submodule_search_locations=[os.path.join(self.root, rel)] if package else None,
            )
            return spec
        return None


class _FdSourceLoader:
    def __init__(self, dir_fd: int, relpath: str, origin: str):
        self.dir_fd, self.relpath, self.origin = dir_fd, relpath, origin

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        fd = os.open(self.relpath, os.O_RDONLY, dir_fd=self.dir_fd)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        exec(compile(b"".join(chunks), self.origin, "exec", dont_inherit=True), module.__dict__)


def _serve(cfg: dict) -> None:
    """Worker main loop: one job frame in, one report frame out, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _unshare_network()
    _preload()
    while True:
        job = _read_frame(0)
        if job is None:
            return
        try:
            _write_frame(1, _run_job(job, cfg))
        except BrokenPipeError:
            return  # the parent is gone


def _run_job(job: tuple, cfg: dict) -> dict:
    tmp = tempfile.mkdtemp(dir=cfg["base"])
    if os.geteuid() == 0:
        os.chown(tmp, _NOBODY, _NOBODY)
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(job, tmp, res_w, out_w, cfg)  # never returns
    os.close(res_w)
    os.close(out_w)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it (or is gone)
    try:
        return _supervise(pid, res_r, out_r, cfg)
    finally:
        os.close(res_r)
        os.close(out_r)
        shutil.rmtree(tmp, ignore_errors=True)


def _kill(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except OSError:
            pass


def _supervise(pid: int, res_r: int, out_r: int, cfg: dict) -> dict:
    """Drain the child's pipes (capped) until it exits or the deadline passes."""
    deadline = time.monotonic() + cfg["wall_s"]
    caps = {res_r: _FLOOD_LIMIT, out_r: cfg["max_output"]}
    kept = {res_r: bytearray(), out_r: bytearray()}
    seen = {res_r: 0, out_r: 0}
    open_fds, verdict, status = [res_r, out_r], None, 0
    while verdict is None:
        left = deadline - time.monotonic()
        if left <= 0:
            verdict = "timeout"
        elif open_fds:
            for fd in select.select(open_fds, [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                seen[fd] += len(chunk)
                kept[fd] += chunk[: max(0, caps[fd] - len(kept[fd]))]
                if seen[fd] > _FLOOD_LIMIT:
                    verdict = "output limit exceeded"
        else:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return _report("exit", status, kept[res_r], kept[out_r], seen[out_r])
            time.sleep(0.0005)
    _kill(pid)
    os.waitpid(pid, 0)
    return _report(verdict, 0, kept[res_r], kept[out_r], seen[out_r])


def _report(verdict: str, status: int, results: bytes, output: bytes, seen: int) -> dict:
    if verdict == "exit" and os.WIFSIGNALED(status):
        verdict = f"signal {os.WTERMSIG(status)}"
    elif verdict == "exit":
        verdict = f"exit {os.WEXITSTATUS(status)}"
    return {"verdict": verdict, "results": bytes(results), "output": bytes(output), "truncated": seen > len(output)}


# =========================================================================== child side
def _child(job: tuple, tmp: str, res_w: int, out_w: int, cfg: dict) -> None:
    """Runs in the forked child: confine, evaluate, exit.  Never returns."""
    try:
        _confine(tmp, res_w, out_w, cfg)
        _evaluate(job)
    except BaseException as exc:  # noqa: BLE001 -- report, never unwind into the worker loop
        try:
            _emit({"load": f"sandbox setup failed: {type(exc).__name__}: {exc}"})
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(0)


def _confine(tmp: str, res_w: int, out_w: int, cfg: dict) -> None:
    os.setpgid(0, 0)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.dup2(res_w, 3)
    os.closerange(4, 1 << 16)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
    os.chdir(tmp)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"})
    tempfile.tempdir = tmp
    _set_limits(cfg)
    if os.geteuid() == 0:
        stdlib = os.path.dirname(os.__file__)
        stdlib_fd = os.open(stdlib, os.O_RDONLY | os.O_DIRECTORY)
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
        if os.access(os.__file__, os.R_OK):
            os.close(stdlib_fd)
        else:  # the stdlib is out of nobody's reach by path: load it through the descriptor
            finder = next(i for i, f in enumerate(sys.meta_path) if getattr(f, "__name__", "") == "PathFinder")
            sys.meta_path.insert(finder, _StdlibFinder(stdlib_fd, stdlib))
            sys.path_importer_cache.clear()
    for name in list(sys.modules):
        if name.split(".")[0] in _BLOCKED_MODULES:
            del sys.modules[name]
    sys.addaudithook(_make_guard(os.path.realpath(tmp), _read_roots()))


def _set_limits(cfg: dict) -> None:
    import resource

    cpu = int(cfg["cpu_s"])
    mem = int(cfg["mem_mb"]) << 20
    for limit, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_FSIZE, _FSIZE_LIMIT, _FSIZE_LIMIT),
        (resource.RLIMIT_NPROC, 0, 0),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        resource.setrlimit(limit, (soft, hard))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise instead of killing
    signal.alarm(int(cfg["wall_s"]) + 2)  # backstop if the worker dies and cannot kill us


def _read_roots() -> tuple[str, ...]:
    """Directories a program may read from: the Python installation (imports)."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(os.__file__)}
    return tuple(sorted(os.path.realpath(d) + "/" for d in dirs)) + ("/dev/null", "/dev/urandom")


def _make_guard(tmp: str, read_roots: tuple[str, ...]):
    """The audit hook.  Everything it uses is captured now, so a program that
    monkeypatches ``os`` or ``os.path`` cannot change its decisions."""
    getcwd, inside = os.getcwd, tmp + "/"

    def resolve(path) -> str | None:
        if type(path) is bytes:
            path = path.decode("utf-8", "surrogateescape")
        if type(path) is not str:
            return None
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        parts: list[str] = []
        for part in path.split("/"):
            if part == "..":
                parts = parts[:-1]
            elif part not in ("", "."):
                parts.append(part)
        return "/" + "/".join(parts)

    def allowed(path, write: bool) -> bool:
        full = resolve(path)
        if full is None:
            return False
        if full == tmp or full.startswith(inside):
            return True
        return not write and (full in read_roots or full.startswith(read_roots))

    def refuse(event: str, detail: object = "") -> None:
        raise PermissionError(f"sandbox: {event} {detail!r} refused" if detail else f"sandbox: {event} refused")

    def guard(event: str, args: tuple) -> None:
        if event.startswith(_DENIED_EVENTS):
            refuse(event)
        elif event == "import":
            if str(args[0]).split(".")[0] in _BLOCKED_MODULES:
                refuse("import", args[0])
        elif event == "open":
            path, mode, flags = args
            if type(path) is int:
                return
            write = any(c in str(mode) for c in "wax+") if mode is not None else bool(flags & _WRITE_FLAGS)
            if not allowed(path, write):
                refuse("open", path)
        elif event in _WRITE_PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, (str, bytes)) and not allowed(path, True):
                    refuse(event, path)
        elif event in _READ_PATH_EVENTS:
            if args and args[0] is not None and not allowed(args[0], False):
                refuse(event, args[0])

    return guard


def _emit(obj: dict) -> None:
    data = memoryview((json.dumps(obj) + "\n").encode("utf-8", "replace"))
    while data:
        data = data[os.write(3, data) :]


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:
        text = type(exc).__name__
    return text[:300]


def _evaluate(job: tuple) -> None:
    source, fname, arg_list = job
    try:
        code = compile(source, "<program>", "exec")
    except BaseException as exc:
        _emit({"load": f"syntax error: {_describe(exc)}"})
        return
    namespace: dict = {"__name__": "solution"}
    try:
        exec(code, namespace)
    except BaseException as exc:
        _emit({"load": f"error: {_describe(exc)}"})
        return
    fn = namespace.get(fname)
    if not callable(fn):
        _emit({"load": f"error: function {fname} is not defined"})
        return
    for i, args in enumerate(arg_list):
        try:
            _emit({"i": i, "out": _plain_repr(fn(*args))})
        except BaseException as exc:
            _emit({"i": i, "err": _describe(exc)})


def _plain_repr(value) -> str:
    """repr of plain data only (exact builtin types), bounded in depth and size;
    anything else becomes an opaque ``<type object>`` that never equals a value."""
    out: list[str] = []
    size = [0]

    def walk(v, depth: int) -> None:
        if depth > 30 or size[0] > _REPR_LIMIT:
            raise ValueError
        t = type(v)
        if t in (int, bool, float, str, bytes, type(None)):
            text = repr(v) if t is not int or abs(v) < 10**300 else "<huge int>"
        elif t in (list, tuple, set, frozenset, dict):
            return walk_container(v, t, depth)
        else:
            text = f"<{t.__name__} object>"
        size[0] += len(text)
        out.append(text)

    def walk_container(v, t, depth: int) -> None:
        items = list(v.items()) if t is dict else list(v)
        if t in (set, frozenset) and not items:
            out.append(f"{t.__name__}()")
            return
        opener, closer = {list: "[]", tuple: "()", dict: "{}", set: "{}", frozenset: "{}"}[t]
        out.append("frozenset(" + opener if t is frozenset else opener)
        for k, item in enumerate(items):
            if k:
                out.append(", ")
            if t is dict:
                walk(item[0], depth + 1)
                out.append(": ")
                item = item[1]
            walk(item, depth + 1)
        out.append(("," if t is tuple and len(items) == 1 else "") + closer + (")" if t is frozenset else ""))

    try:
        walk(value, 0)
    except (ValueError, RecursionError):
        return "<value too large>"
    return "".join(out)


# =========================================================================== parent side
class _Worker:
    """One worker interpreter and its job pipes."""

    def __init__(self, cfg: dict):
        import subprocess  # parent only: keeps it out of the workers' sys.modules

        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
            close_fds=True,
        )
        self.fd_in = self.proc.stdin.fileno()
        self.fd_out = self.proc.stdout.fileno()

    def send(self, body: bytes) -> bool:
        try:
            _write_body(self.fd_in, body)
            return True
        except OSError:
            return False

    def receive(self) -> dict | None:
        try:
            return _read_frame(self.fd_out)
        except (OSError, pickle.UnpicklingError, EOFError):
            return None

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc.wait()


class Sandbox:
    """A pool of sandbox workers.  Context manager; ``close()`` shuts it down."""

    def __init__(
        self, workers: int = 2, cpu_s: float = 2, wall_s: float = 4, mem_mb: int = 256, max_output: int = 8192
    ):
        self._base = tempfile.mkdtemp(prefix="sandbox-")
        os.chmod(self._base, 0o711)  # children run as nobody and must reach their own dir
        self._cfg = {
            "cpu_s": max(1, int(cpu_s)),
            "wall_s": wall_s,
            "mem_mb": mem_mb,
            "max_output": max_output,
            "base": self._base,
        }
        self._lock = threading.Lock()
        self._workers = [_Worker(self._cfg) for _ in range(max(1, workers))]
        self._closed = False

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                w.stop()
            shutil.rmtree(self._base, ignore_errors=True)

    def run_tests(self, jobs: list[tuple[str, str, list[tuple[tuple, object]]]]) -> list[ExecResult]:
        """Run ``(program_source, function_name, [(args, expected), ...])`` jobs in
        parallel; results come back in job order.  Never raises on hostile input."""
        with self._lock:
            if self._closed:
                raise RuntimeError("sandbox is closed")
            results: list[ExecResult | None] = [None] * len(jobs)
            wire = [self._prepare(job) for job in jobs]
            pending = [i for i, w in enumerate(wire) if not isinstance(w, ExecResult)]
            for i, w in enumerate(wire):
                if isinstance(w, ExecResult):
                    results[i] = w
            self._dispatch(jobs, wire, pending[::-1], results)
            return results  # type: ignore[return-value]

    @staticmethod
    def _prepare(job) -> tuple[list, bytes] | ExecResult:
        """(argument tuples, pickled job for a worker), or the reason it is invalid."""
        try:
            source, fname, cases = job
            arg_list = [tuple(args) for args, _ in cases]
            return arg_list, pickle.dumps((str(source), str(fname), arg_list), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            return ExecResult(False, 0, 0, f"invalid job: {_describe(exc)}", "")

    def _dispatch(self, jobs, wire, todo: list[int], results: list) -> None:
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (job index, deadline)
        grace = self._cfg["wall_s"] + 10
        while todo or busy:
            for slot in range(len(self._workers)):
                if todo and slot not in busy:
                    i = todo.pop()
                    if self._send(slot, wire[i][1]):
                        busy[slot] = (i, time.monotonic() + grace)
                    else:
                        results[i] = _judge(jobs[i][2], jobs[i][1], {"verdict": "worker died"}, wire[i])
            if not busy:
                continue
            fds = {self._workers[s].fd_out: s for s in busy}
            wait = max(0.0, min(d for _, d in busy.values()) - time.monotonic())
            for fd in select.select(list(fds), [], [], wait)[0]:
                slot = fds[fd]
                i, _ = busy.pop(slot)
                report = self._workers[slot].receive()
                if report is None:
                    self._restart(slot)
                    report = {"verdict": "worker died"}
                results[i] = _judge(jobs[i][2], jobs[i][1], report, wire[i])
            for slot, (i, deadline) in list(busy.items()):
                if time.monotonic() > deadline:
                    del busy[slot]
                    self._restart(slot)
                    results[i] = _judge(jobs[i][2], jobs[i][1], {"verdict": "timeout"}, wire[i])

    def _send(self, slot: int, body: bytes) -> bool:
        """Send a job, restarting the worker once if it died while idle."""
        if self._workers[slot].send(body):
            return True
        self._restart(slot)
        return self._workers[slot].send(body)

    def _restart(self, slot: int) -> None:
        self._workers[slot].stop()
        self._workers[slot] = _Worker(self._cfg)


# =========================================================================== judging (parent)
_DEATHS = {
    "worker died": "killed: sandbox worker died",
    f"signal {int(signal.SIGXCPU)}": "timeout",
    f"signal {int(signal.SIGKILL)}": "killed",
}


def _call_text(fname: str, args: tuple) -> str:
    text = f"{fname}({', '.join(repr(a) for a in args)})"
    return text if len(text) <= 160 else text[:157] + "..."


def _clip(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _parse_results(raw: bytes, n: int) -> tuple[str | None, dict[int, dict]]:
    """Child result lines -> (load error, {test index: line}); ignores junk."""
    load, per_test = None, {}
    for line in raw.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if isinstance(obj.get("load"), str) and load is None:
            load = obj["load"]
        i = obj.get("i")
        if type(i) is int and 0 <= i < n and i not in per_test:
            per_test[i] = obj
    return load, per_test


def _value(text) -> tuple[bool, object]:
    import ast

    try:
        return True, ast.literal_eval(text)
    except Exception:  # not plain data (opaque object, nan, junk)
        return False, None


def _check(line: dict, expected) -> str | None:
    """None if the test passed, else what went wrong (without the call)."""
    if isinstance(line.get("err"), str):
        return f"raised {_clip(line['err'], 200)}"
    text = str(line.get("out"))
    parsed, value = _value(text)
    try:
        if parsed and value == expected:
            return None
    except Exception:
        pass
    return f"returned {_clip(text)}, expected {_clip(repr(expected))}"


def _death(verdict: str) -> str:
    if verdict in _DEATHS:
        return _DEATHS[verdict]
    if verdict.startswith("signal "):
        try:
            return f"crashed ({signal.Signals(int(verdict[7:])).name})"
        except ValueError:
            return f"crashed ({verdict})"
    if verdict.startswith("exit "):
        return f"exited early ({verdict})"
    return verdict


def _judge(cases, fname: str, report: dict, wire: tuple[list, bytes]) -> ExecResult:
    n = len(cases)
    raw_out = report.get("output", b"")
    output = raw_out.decode("utf-8", "replace") + ("\n...[output truncated]" if report.get("truncated") else "")
    load, per_test = _parse_results(report.get("results", b""), n)
    if load is not None:
        return ExecResult(False, 0, n, "memory" if load.startswith("error: MemoryError") else load, output)
    passed, first_fail, failed_test = 0, None, None
    for i, (_args, expected) in enumerate(cases):
        if i not in per_test:
            break
        problem = _check(per_test[i], expected)
        if problem is None:
            passed += 1
        elif first_fail is None:
            what = "memory: failed" if problem.startswith("raised MemoryError") else "failed"
            first_fail, failed_test = f"{what} test {i + 1}: {_call_text(fname, wire[0][i])} {problem}", i
    if first_fail is not None:
        return ExecResult(False, passed, n, first_fail, output, failed_test)
    if len(per_test) < n:
        missing = len(per_test)
        reason = _death(report.get("verdict", "worker died"))
        where = (
            f" on test {missing + 1}: {_call_text(fname, wire[0][missing])}" if reason in ("timeout", "memory") else ""
        )
        return ExecResult(False, passed, n, reason + where, output)
    return ExecResult(True, passed, n, "ok", output)


# =========================================================================== shared default
_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox(workers: int = 2) -> Sandbox:
    """The process-wide shared sandbox (created on first use, closed at exit)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Sandbox(workers=workers)
            atexit.register(_default.close)
        return _default


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
