"""Starting a sandbox and waiting for it: the status pipe, signals and
timers, a concurrent second run, and the launcher's identity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .adapters.base import RunResult
from .contract import Contract
from .hostfx import Containment, Terminal, processes_matching

NOBODY = 65534


@dataclass
class Hooks:
    """What the launch does besides starting and waiting: extra pre-exec
    steps in the launcher, listeners bound after the start, signals."""

    preexec: list[Any] = field(default_factory=list)
    delayed: list[Any] = field(default_factory=list)
    elapsed: float = 0.0  # seconds from start until the launcher exited (or was killed)


class ConcurrentRun:
    """A second run of the same sandbox, started `after` seconds after the
    contract's own run (two runs sharing a tree)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, after: float, contain: Containment,
                 timeout: float):
        self.argv, self.env, self.cwd, self.after, self.contain, self.timeout = argv, env, cwd, after, contain, timeout
        self.proc: subprocess.Popen | None = None
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        self._timer = threading.Timer(self.after, self._run)
        self._timer.daemon = True
        self._timer.start()

    def _run(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=self.contain.preexec)
        try:
            self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(timeout=self.timeout)
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc.pid)
            self.proc.wait(timeout=10)


def become_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


class StatusPipe:
    """The pipe behind `--status-fd`: the sandbox's supervisor holds the
    write end; the runner reads JSON lines from the other after the run."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._closed: set[int] = set()

    def close_write(self) -> None:
        if self.write_fd not in self._closed:
            os.close(self.write_fd)
            self._closed.add(self.write_fd)

    def events(self) -> list[dict[str, Any]]:
        data = bytearray()
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return parse_status(data.decode(errors="replace"))

    def close(self) -> None:
        self.close_write()
        if self.read_fd not in self._closed:
            os.close(self.read_fd)
            self._closed.add(self.read_fd)


def parse_status(text: str) -> list[dict[str, Any]]:
    """JSON objects, one per line; anything else is ignored (and so can never
    make a refusal)."""
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def launch(argv: list[str], env: dict[str, str], cwd: str, c: Contract, contain: Containment,
           term: Terminal | None, root: Path, status: StatusPipe | None = None,
           hooks: Hooks | None = None) -> tuple[RunResult, int | None]:
    hooks = hooks or Hooks()
    out_path, err_path = root / "stdout.txt", root / "stderr.txt"
    with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
        if term is not None:
            stdin = stdout = term.slave
            stderr = err_f

            def pre() -> None:
                contain.preexec()
                term.preexec()
                for step in hooks.preexec:
                    step()
        else:
            stdin, stdout, stderr = subprocess.DEVNULL, out_f, err_f

            def pre() -> None:
                contain.preexec()
                for step in hooks.preexec:
                    step()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=True, preexec_fn=pre,
                                pass_fds=(status.write_fd,) if status is not None else ())
        if status is not None:
            status.close_write()  # the supervisor holds the only write end now
        started = time.monotonic()
        pgid = proc.pid
        for lst in hooks.delayed:
            lst.start()
        timers = [threading.Timer(float(sig["after"]), send_signal, (proc, getattr(signal, "SIG" + sig["signal"])))
                  for sig in c.setup.get("signals", [])]
        if c.setup.get("kill_group_after") is not None:
            timers.append(threading.Timer(float(c.setup["kill_group_after"]), kill_group, (pgid,)))
        for t in timers:
            t.daemon = True
            t.start()
        timed_out = False
        kill_after = c.setup.get("kill_after")
        try:
            if kill_after is not None:
                try:
                    proc.wait(timeout=float(kill_after))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)  # the supervisor only, not its group
                proc.wait(timeout=c.timeout)
                time.sleep(1.0)  # give the sandbox time to die with its supervisor
            else:
                proc.wait(timeout=c.timeout)
                if c.setup.get("kill_group_after") is not None:
                    time.sleep(1.5)  # give the sandbox time to die with its supervisor
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            contain.kill(None)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    hooks.elapsed = time.monotonic() - started
    for t in timers:
        t.cancel()
    stdout_text = out_path.read_text(errors="replace")
    stderr_text = err_path.read_text(errors="replace")
    events = status.events() if status is not None else None
    return RunResult(proc.returncode, stdout_text, stderr_text, timed_out, status_events=events), pgid


def send_signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_token_processes(token: str) -> None:
    """A safety net: processes whose command line holds this run's random
    token were started by this run (an agent that escaped its sandbox's
    cgroup and session); end them."""
    for pid in processes_matching(token, {os.getpid()}):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
