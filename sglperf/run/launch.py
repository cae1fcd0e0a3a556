"""Launcher: start a server from an argv (never a shell) on a free port in its own process group, log to a file,
wait for /health 200, watch for a crash, and tear the whole tree down (SIGTERM -> wait -> SIGKILL), checking that
nothing of it survives.

Why so careful: a nightly job on an 8-GPU box must fail fast with the server's own error, and leave the box clean
for the next server; SGLang is a process tree whose children hold GPU memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from ..categories import InfraError
from ..environment import gpu
from ..fileio import atomic_write_json
from ..redact import redact_argv


class LaunchError(InfraError):
    """The server did not become ready: an infrastructure failure, with the server's own words attached."""

    def __init__(self, message: str, *, exit_code: int | None = None, log_path: Path | None = None,
                 log_tail: str = ""):
        self.exit_code, self.log_path, self.log_tail = exit_code, log_path, log_tail
        super().__init__(message)


EXIT_MEANING = {
    2: "bad argument (the server's argument parser refused the command line)",
    1: "start-up error (argument resolution or initialisation raised)",
    -9: "killed by SIGKILL (a crash path or the OOM killer)",
}


def describe_exit(code: int) -> str:
    if code in EXIT_MEANING:
        return EXIT_MEANING[code]
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return "exited"


class PortInUse(LaunchError):
    pass


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: Linux kills it (SIGKILL) when the process that launched it dies, even by kill -9.
    Elsewhere a no-op; the registry below still lets the next run end what is left."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _register(registry: Path | None, proc: subprocess.Popen, spec: "LaunchSpec", argv: list[str],
              log_path: Path) -> Path | None:
    """Record the server's process group so that a later run can end it if this process dies without doing so."""
    if registry is None:
        return None
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        return None
    entry = {"pid": proc.pid, "pgid": proc.pid, "create_time": created, "owner_pid": os.getpid(),
             "owner_create_time": psutil.Process().create_time(), "name": spec.name,
             "argv": redact_argv(argv, list(spec.secrets)), "log": str(log_path),
             "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path = registry / f"{proc.pid}.json"
    try:
        atomic_write_json(path, entry)
    except OSError:  # a full disk: the server still runs and is stopped by this run; only a kill -9 would orphan it
        return None
    return path


def _same_process(pid: int, create_time: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - create_time) < 0.01
    except psutil.Error:
        return False


def reap_leftovers(registry: Path) -> list[str]:
    """End the servers that a run which died without tearing them down left behind (their launcher is gone), by
    process group, after checking that the pid is still the process that was started (not a reused pid).
    Returns what was found, in words."""
    found = []
    for path in sorted(Path(registry).glob("*.json")):
        try:
            e = json.loads(path.read_text())
            pid, pgid = int(e["pid"]), int(e["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if _same_process(int(e.get("owner_pid", -1)), float(e.get("owner_create_time", 0))):
            continue  # its launcher is alive: not a leftover
        members = [p.pid for p in psutil.process_iter() if _in_group(p.pid, pgid)]
        if _same_process(pid, float(e["create_time"])) or (members and not psutil.pid_exists(pid)):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and _alive(members):
                    time.sleep(0.1)
                if not _alive(members):
                    break
            found.append(f"ended server {e.get('name')!r} (pid {pid}, started {e.get('started')} by pid "
                         f"{e.get('owner_pid')}, which is gone): {' '.join(e.get('argv') or [])[:200]}")
        if not _alive([p.pid for p in psutil.process_iter() if _in_group(p.pid, pgid)]):
            removed = remove_left_shm({x for x in e.get("shm") or [] if str(x).startswith(SHM)})
            if removed:
                found.append(f"removed what server {e.get('name')!r} of a dead run left in /dev/shm: "
                             f"{', '.join(removed)}")
        path.unlink(missing_ok=True)
    return found


def _note_shm(registered: Path | None, shm: set[str]) -> None:
    """The /dev/shm files the server holds once ready, in its registry entry: a run killed with -9 cannot remove
    them, the next one's reap_leftovers does."""
    if registered is None or not shm:
        return
    with contextlib.suppress(OSError, ValueError):
        entry = json.loads(registered.read_text())
        atomic_write_json(registered, {**entry, "shm": sorted(shm)})


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False


def _pump(src, dst, secrets: tuple[str, ...], ready_line: str | None = None,
          said_ready: threading.Event | None = None) -> None:
    """Copy the server's output to its log file line by line, replacing secrets (SGLang logs its api_key); set
    `said_ready` when the server prints `ready_line`."""
    words = [w.encode() for w in secrets if w]
    ready = ready_line.encode() if ready_line else None
    lost = False  # the log's disk is full: the pipe is still drained, or the server would block writing to it
    try:
        for line in iter(src.readline, b""):
            if ready and said_ready is not None and ready in line:
                said_ready.set()
            if lost:
                continue
            for w in words:
                line = line.replace(w, b"<redacted>")
            try:
                dst.write(line)
            except OSError:
                lost = True
    finally:
        src.close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_lost(log_path: Path, port: int) -> bool:
    """The server's log says its bind of `port` failed while the process lives on: SGLang's uvicorn logs "address
    already in use" and its processes stay, so /health never answers and the launch would wait out its timeout
    (docs/measurement.md, "A port taken before the bind"). Only a line naming the port counts, so a bind the server
    recovers from elsewhere never stops it."""
    return any("address already in use" in ln.lower() and str(port) in ln for ln in tail(log_path, 20).splitlines())


def tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def error_lines(text: str) -> str:
    """The lines a human wants first: the argparse error or the exception line."""
    keys = ("error:", "Error", "Exception", "assert", "Traceback")
    found = [ln for ln in text.splitlines() if any(k in ln for k in keys)]
    return "\n".join(found[-5:])


@dataclass(frozen=True)
class LaunchSpec:
    name: str
    argv: list[str]  # the command without host/port; the launcher appends them
    log_dir: Path
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    host_flag: str = "--host"
    port_flag: str = "--port"
    env: dict[str, str] = field(default_factory=dict)
    launch_timeout_s: float = 3600.0
    ready_path: str = "/health"
    terminate_timeout_s: float = 60.0
    secrets: tuple[str, ...] = ()
    registry: Path | None = None  # where the launch is recorded for reap_leftovers (None: not recorded)
    # what the server's log prints once it serves (SGLang's "ready to roll"); from then on `ready_path` must answer
    # 200 within ready_grace_s, or the server hung once started and the launch fails then, not at launch_timeout_s
    ready_line: str | None = None
    ready_grace_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"server {self.name!r}: empty launch command")


@dataclass(frozen=True)
class TeardownReport:
    exit_code: int | None
    graceful: bool  # ended on SIGTERM within the timeout
    killed: tuple[int, ...]  # pids that needed SIGKILL
    survivors: tuple[int, ...]  # pids still alive afterwards (should be empty)
    seconds: float
    gpu_release_s: float | None = None  # how long the driver took to free the tree's GPU memory (None: no GPU)
    gpu_held_by: tuple[int, ...] = ()  # pids still holding GPU memory when the wait gave up
    removed_shm: tuple[str, ...] = ()  # shared-memory files the server's processes held and left behind


class Server:
    """A launched server; `url` is what clients use."""

    def __init__(self, spec: LaunchSpec, proc: subprocess.Popen | None, url: str, log_path: Path | None,
                 argv: list[str]):
        self.spec, self.proc, self.url, self.log_path, self.argv = spec, proc, url, log_path, argv
        self._log_file = None
        self._pump = None
        self._registered: Path | None = None
        self.teardown: TeardownReport | None = None
        self.shm: set[str] = set()  # /dev/shm files its processes held (SGLang leaves its load snapshot there)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def display_argv(self) -> list[str]:
        return redact_argv(self.argv, list(self.spec.secrets))

    def crash_reason(self) -> str | None:
        """None while the process lives; otherwise what happened, with the log's error lines."""
        if self.proc is None or self.teardown is not None:
            return None
        code = self.proc.poll()
        if code is None:
            return None
        t = tail(self.log_path) if self.log_path else ""
        return (f"server {self.spec.name!r} (pid {self.proc.pid}) died: exit code {code}, {describe_exit(code)}. "
                f"Log: {self.log_path}\n{error_lines(t) or t[-2000:]}")

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines) if self.log_path else ""

    def tree_pids(self) -> list[int]:
        """The server's processes: its process group and descendants; for a server someone else started on this
        host (--server-url on loopback), the process listening on its port and its descendants."""
        if self.proc is None:
            return listener_tree(self.url)
        pids = {self.proc.pid}
        try:
            pids |= {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        pgid = self.proc.pid  # start_new_session: the server leads its own group
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == pgid:
                    pids.add(p.pid)
            except (ProcessLookupError, PermissionError):
                continue
        return sorted(pids)

    def stop(self) -> TeardownReport:
        """SIGTERM the server (its graceful path), wait, then SIGKILL the group and every descendant."""
        if self.teardown is not None:
            return self.teardown
        t0 = time.monotonic()
        if self.proc is None:
            self.teardown = TeardownReport(None, True, (), (), 0.0)
            return self.teardown
        tree = self.tree_pids()
        self.shm |= shm_files(tree)
        graceful = True
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(self.spec.terminate_timeout_s)
            except subprocess.TimeoutExpired:
                graceful = False
        # Children of a dead parent may linger for a moment (PDEATHSIG, a poll loop): give them a second.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and _alive([p for p in tree if p != self.proc.pid]):
            time.sleep(0.05)
        killed = _alive(tree + self.tree_pids())
        if killed:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for pid in killed:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        deadline = time.monotonic() + 10
        survivors = _alive(tree)
        while survivors and time.monotonic() < deadline:
            time.sleep(0.05)
            survivors = _alive(tree)
        t_gpu = time.monotonic()
        held = gpu.wait_for_release(tree)
        gpu_s = time.monotonic() - t_gpu if shutil.which("nvidia-smi") else None
        removed = remove_left_shm(self.shm) if not survivors else ()
        if self._pump is not None:
            self._pump.join(5)
        if self._log_file:
            if gpu_s is not None:  # the log says how long teardown waited for the driver
                self._log_file.write((f"[sglperf] teardown: GPU memory of the server's processes released "
                                      f"{gpu_s:.1f} s "
                                      f"after they ended\n" if not held else
                                      f"[sglperf] teardown: pids {held} still hold GPU memory after {gpu_s:.0f} s\n"
                                      ).encode())
            self._log_file.close()
        self.teardown = TeardownReport(code, graceful and not killed, tuple(killed), tuple(survivors),
                                       time.monotonic() - t0, None if gpu_s is None else round(gpu_s, 2), tuple(held),
                                       removed)
        if self._registered is not None and not survivors:
            self._registered.unlink(missing_ok=True)
        return self.teardown


SHM = "/dev/shm/"


def shm_files(pids: list[int]) -> set[str]:
    """The /dev/shm files `pids` hold open or mapped (/proc/PID/fd and /proc/PID/maps)."""
    out = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(SHM):
                        out.add(target.removesuffix(" (deleted)"))
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith(SHM):
                        out.add(parts[5].strip().removesuffix(" (deleted)"))
        except OSError:  # the process is gone, or not ours to read
            continue
    return out


def remove_left_shm(paths: set[str]) -> tuple[str, ...]:
    """Remove the shared-memory files the server's processes held and did not remove (SGLang's load snapshot and
    semaphores outlive even a clean exit): only those, only once every process of the server is gone."""
    removed = []
    for path in sorted(paths):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(path)
            removed.append(path)
    return tuple(removed)


def listener_tree(url: str) -> list[int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or not parts.port:
        return []
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == parts.port and c.pid:
            try:
                return [c.pid] + [p.pid for p in psutil.Process(c.pid).children(recursive=True)]
            except psutil.Error:
                return [c.pid]
    return []


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in set(pids):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(out)


def launch(spec: LaunchSpec) -> Server:
    """Start and wait for readiness. An auto-chosen port that another process took meanwhile is retried."""
    for attempt in range(3):
        try:
            return _launch_once(spec, spec.port or free_port(spec.host))
        except PortInUse:
            if spec.port is not None or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _launch_once(spec: LaunchSpec, port: int) -> Server:
    argv = [*spec.argv, spec.host_flag, spec.host, spec.port_flag, str(port)]
    log_dir = Path(spec.log_dir)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"cannot create the server log directory {log_dir}: {e}") from None
    # the name comes from user input (a profile's name, a config's): one path segment of plain characters, so the log
    # lands in log_dir whatever it holds
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.name).strip("._") or "server"
    log_path = log_dir / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
    log_file = open(log_path, "ab", buffering=0)
    try:
        log_file.write(("# " + " ".join(redact_argv(argv, list(spec.secrets))) + "\n").encode())
    except OSError:
        pass  # a full disk: the server is started all the same (_pump drains its output)
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, preexec_fn=_die_with_parent)
    except OSError as e:
        log_file.close()
        raise LaunchError(f"cannot start server {spec.name!r}: {argv[0]}: {e}", log_path=log_path) from None
    url = f"http://{'127.0.0.1' if spec.host in ('0.0.0.0', '') else spec.host}:{port}"
    server = Server(spec, proc, url, log_path, argv)
    server._registered = _register(spec.registry, proc, spec, argv, log_path)
    server._log_file = log_file
    said_ready = threading.Event()
    server._pump = threading.Thread(target=_pump, args=(proc.stdout, log_file, spec.secrets, spec.ready_line,
                                                        said_ready), daemon=True, name=f"log-{spec.name}")
    server._pump.start()
    try:
        _wait_ready(server, said_ready)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: Server, said_ready: threading.Event) -> None:
    """Poll the ready path until it answers 200, the process exits, the launch timeout passes, or the log said
    ready `ready_grace_s` ago and the ready path has not answered 200 since: a server that hangs right after its
    start (its /health waits out SGLang's 20-s health-check timeout) fails in a minute, not at a launch timeout
    sized for a first start's compiles (an hour for the GLM-5 profile)."""
    spec, proc, log_path = server.spec, server.proc, server.log_path
    assert proc is not None and log_path is not None
    deadline = time.monotonic() + spec.launch_timeout_s
    ready_at: float | None = None
    delay, last = 0.05, "no answer yet"
    with requests.Session() as session:
        while True:
            code = proc.poll()
            if code is not None:
                server.stop()
                t = tail(log_path)
                kind = PortInUse if "address already in use" in t.lower() else LaunchError
                raise kind(
                    f"server {spec.name!r} exited during start-up with code {code} ({describe_exit(code)}).\n"
                    f"Its error: {error_lines(t) or '(none printed)'}\nLog: {log_path}\n--- log tail ---\n{t}",
                    exit_code=code, log_path=log_path, log_tail=t)
            try:
                r = session.get(server.url + spec.ready_path, timeout=5)
                if r.status_code == 200:
                    server.shm |= shm_files(server.tree_pids())
                    _note_shm(server._registered, server.shm)
                    return
                last = f"HTTP {r.status_code}"
            except requests.RequestException as e:
                last = "timed out after 5 s" if isinstance(e, requests.Timeout) else type(e).__name__
            if port_lost(log_path, int(server.url.rsplit(":", 1)[1])):
                try:
                    proc.wait(timeout=2)
                    continue  # it exited: told above, with its code
                except subprocess.TimeoutExpired:
                    pass
                server.stop()
                t = tail(log_path)
                raise PortInUse(f"server {spec.name!r} could not bind a port another process took after it was "
                                f"chosen ({error_lines(t) or 'address already in use'}); stopped it.\nLog: {log_path}",
                                log_path=log_path, log_tail=t)
            now = time.monotonic()
            if said_ready.is_set() and ready_at is None:
                ready_at = now
            hung = ready_at is not None and now - ready_at >= spec.ready_grace_s
            if hung or now >= deadline:
                server.stop()
                t = tail(log_path)
                why = (f"its log said {spec.ready_line!r} {now - ready_at:.0f} s ago, and {spec.ready_path} has not "
                       f"answered 200 since (last: {last}): it hung once started" if hung and ready_at is not None
                       else f"was not ready ({spec.ready_path} 200) within {spec.launch_timeout_s:g} s (last: {last})")
                raise LaunchError(f"server {spec.name!r} {why}; stopped it.\nLog: {log_path}\n--- log tail ---\n{t}",
                                  log_path=log_path, log_tail=t)
            if said_ready.is_set():
                time.sleep(delay)
            elif said_ready.wait(delay):  # the log says ready: ask at once (a server may hang a moment later)
                continue
            delay = min(1.0, delay * 1.5)


def external(url: str, name: str = "external") -> Server:
    """--server-url mode: a server someone else runs; nothing is launched or stopped."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--server-url must start with http:// or https://, got {url!r}")
    spec = LaunchSpec(name=name, argv=["(external)"], log_dir=Path("."))
    return Server(spec, None, url.rstrip("/"), None, [])
