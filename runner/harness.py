"""Running one contract against one sandbox, in fresh directories."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import classify as C
from .adapters.base import Adapter, Context, Unsupported
from .checks import evaluate_checks, evaluate_log
from .contract import Contract, expand
from .hostfx import (BareNetns, Containment, DelayedListener, HostAliases, HostBind, HostPty, LauncherLimits,
                     Listener, LogTmpfs, Terminal, TestCA, UnixDecoys, Victim)
from .launch import NOBODY, ConcurrentRun, Hooks, StatusPipe, become_nobody, kill_token_processes, launch

LAB_TMP = os.environ.get("TARTAROS_LAB_TMP", "/var/lib/tartaros-lab")
SANDBOX_PYTHON = "/usr/bin/python3"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Helper programs contracts copy into their tree (setup.copy from "{lab_lib}/...").
LAB_LIB = str(Path(__file__).resolve().parent / "contracts" / "lib")


@dataclass
class Outcome:
    contract: str
    kind: str
    result: str
    detail: str = ""
    exit_code: int | None = None
    seconds: float = 0.0
    stderr_tail: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)
    # What the sandbox's status channel said (None: it has none), and
    # whether the agent's start marker appeared (None: no marker used).
    status_events: list[dict[str, Any]] | None = None
    agent_started: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def new_values(root: Path, setup: dict[str, Any]) -> dict[str, str]:
    return {
        "root": str(root),
        "work": str(root / "work"),
        "outside": str(root / "outside"),
        "home": str(root / "home"),
        "scratch": str(root / "scratch"),
        "log": str(root / "log" / "effects.jsonl"),
        "secret": "LABSECRET-" + secrets.token_hex(8),
        "token": "labtok-" + secrets.token_hex(6),
        "python": SANDBOX_PYTHON,
        "lab_lib": LAB_LIB,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoveAfter:
    """A host path outside the run directory that setup or the agent may create."""

    def __init__(self, path: str):
        self.path = path

    def close(self) -> None:
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            shutil.rmtree(self.path, ignore_errors=True)
        elif os.path.lexists(self.path):
            os.unlink(self.path)


def make_setup(c: Contract, values: dict[str, str], root: Path, agent_uid: int = 0) -> None:
    for d in ("work", "outside", "home", "scratch", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    ex = lambda s: expand(s, values)  # noqa: E731

    def owner(spec: dict[str, Any]) -> int:
        return agent_uid if spec["uid"] == "agent" else int(spec["uid"])
    for d in c.setup.get("dir", []):
        p = Path(ex(d["path"]))
        p.mkdir(parents=True, exist_ok=True)
        if "mode" in d:
            p.chmod(d["mode"])
        if "uid" in d:
            os.chown(p, owner(d), owner(d))
    for f in c.setup.get("file", []):
        paths = [ex(f["path"])]
        if "count" in f:
            paths = [f"{paths[0]}{i:05d}" for i in range(int(f["count"]))]
        for one in paths:
            p = Path(one)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(ex(f.get("content", "")))
            p.chmod(f.get("mode", 0o644))
            if "uid" in f:  # e.g. a file the agent's user owns outside the roots
                os.chown(p, owner(f), owner(f))
            if "mtime" in f:
                os.utime(p, (f["mtime"], f["mtime"]))
    for cp in c.setup.get("copy", []):
        dst = Path(ex(cp["path"]))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ex(cp["from"]), dst)
    for s in c.setup.get("symlink", []):
        p = Path(ex(s["path"]))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(ex(s["target"]))
    for h in c.setup.get("hardlink", []):
        p = Path(ex(h["path"]))
        p.parent.mkdir(parents=True, exist_ok=True)
        os.link(ex(h["target"]), p)
    # Everything under root is world-readable/traversable so that sandboxes
    # which drop to an unprivileged uid see the same tree; work is writable.
    for d in (root, root / "outside", root / "home", root / "scratch"):
        d.chmod(0o755)
    # The agent owns its work tree: make it writable whatever uid the sandbox
    # runs the agent as, so that only the policy (never DAC) can say no.
    for dirpath, dirnames, filenames in os.walk(root / "work"):
        os.chmod(dirpath, 0o777)
        for name in filenames:
            fp = os.path.join(dirpath, name)
            if not os.path.islink(fp):
                os.chmod(fp, 0o666 | (os.stat(fp).st_mode & 0o111))
    (root / "log").chmod(0o755)


def launcher_env(c: Contract, values: dict[str, str]) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": values["home"], "LANG": "C.UTF-8"}
    for k, v in c.launcher_env.items():
        env[k] = expand(v, values)
    return env


def run_contract(c: Contract, adapter: Adapter, keep: bool = False) -> Outcome:
    start = time.monotonic()
    if c.effect_log is not None and not adapter.has_effect_log:
        return Outcome(c.id, c.kind, C.NEEDS_FEATURE, "no supervisor-owned effect log")
    os.makedirs(LAB_TMP, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"tartaros-lab-{adapter.name}-{c.id}-", dir=LAB_TMP))
    fx: dict[str, Any] = {"listeners": {}}
    cleanups: list[Any] = []
    contain: Containment | None = None
    ctx = None
    values: dict[str, str] | None = None
    try:
        values = new_values(root, c.setup)
        aliases = HostAliases(c.setup.get("host_alias", []), f"{os.getpid()}-{root.name}")
        cleanups.append(aliases)
        if c.setup.get("unix_decoys"):
            cleanups.append(UnixDecoys(os.path.join(values["outside"], "decoys"), int(c.setup["unix_decoys"])))
        delayed: list[DelayedListener] = []
        bare_netns: BareNetns | None = None
        test_ca = TestCA(str(root / "tls")) if any(spec.get("tls") for spec in c.listeners) else None
        if test_ca is not None:
            values["lab_ca"] = str(test_ca.ca)
        for spec in c.listeners:
            host = spec.get("host", "127.0.0.1")
            path = expand(spec["path"], values) if "path" in spec else None
            if path:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            if spec.get("delay") and spec["proto"] == "unix" and path:
                lst = DelayedListener(spec["name"], path, float(spec["delay"]))
                delayed.append(lst)
            else:
                netns = aliases.netns_path(host)
                if spec.get("netns") and spec["proto"] == "unix":
                    if bare_netns is None:
                        bare_netns = BareNetns(f"{os.getpid() % 10000}x{len(cleanups)}")
                        cleanups.append(bare_netns)
                    netns = bare_netns.path
                tls = test_ca.server_context(spec["tls"]) if test_ca is not None and spec.get("tls") else None
                lst = Listener(spec["name"], spec["proto"], host, int(spec.get("port", 0)), path,
                               netns=netns, hold=bool(spec.get("hold")), tls=tls,
                               echo=spec.get("echo", False))
            cleanups.append(lst)
            fx["listeners"][spec["name"]] = lst
            values[f"port_{spec['name']}"] = str(lst.port)
            values[f"addr_{spec['name']}"] = host
        for name in c.setup.get("free_port", []):
            values[f"port_{name}"] = str(free_port())
        for path in c.setup.get("remove_after", []):
            cleanups.append(RemoveAfter(expand(path, values)))
        make_setup(c, values, root, adapter.agent_uid)
        if c.setup.get("log_tmpfs"):
            cleanups.append(LogTmpfs(str(root / "log"), str(c.setup["log_tmpfs"])))
        for bind in c.setup.get("bind", []):
            cleanups.append(HostBind(expand(bind["source"], values), expand(bind["target"], values)))
        if c.setup.get("host_pty"):
            fx["host_pty"] = HostPty(adapter.agent_uid)
            cleanups.append(fx["host_pty"])
            values["host_pty"] = fx["host_pty"].path
        if c.setup.get("victim"):
            venv = {"PATH": BASE_PATH, "LAB_VICTIM_SECRET": values["secret"]}
            victim = Victim(values["outside"], venv)
            cleanups.append(victim)
            fx["victim"] = victim
            values["victim_pid"] = str(victim.pid)
        policy = c.policy.expanded(lambda s: expand(s, values))
        cmd = expand(c.cmd, values)
        env = launcher_env(c, values)
        ctx = Context(scratch=values["scratch"], log=values["log"] if c.effect_log is not None else None,
                      launch_env=dict(env), best_effort=c.best_effort)
        status = StatusPipe() if adapter.status_channel() else None
        if status is not None:
            cleanups.append(status)
            ctx.status_fd = status.write_fd
        if adapter.wants_start_marker():
            ctx.start_marker = os.path.join(values["work"], f".lab-started-{secrets.token_hex(4)}")
        argv = adapter.argv(policy, values["work"], cmd, ctx)
        if isinstance(argv, Unsupported):
            return Outcome(c.id, c.kind, C.UNSUPPORTED, str(argv), seconds=time.monotonic() - start)
        env.update(adapter.env(policy, ctx))
        if c.setup.get("tty"):
            fx["tty"] = Terminal()
            cleanups.append(fx["tty"])
        contain = Containment(f"{os.getpid()}-{root.name[-8:]}", use_cgroup=not adapter.own_cgroup)
        hooks = Hooks(delayed=delayed)
        conc = c.setup.get("concurrent")
        if conc is not None:
            scratch2 = root / "scratch-concurrent"
            scratch2.mkdir()
            argv2 = adapter.argv(policy, values["work"], expand(conc["cmd"], values),
                                 Context(scratch=str(scratch2), launch_env=dict(env)))
            if isinstance(argv2, Unsupported):
                return Outcome(c.id, c.kind, C.UNSUPPORTED, str(argv2), seconds=time.monotonic() - start)
            second = ConcurrentRun(argv2, env, values["work"], float(conc.get("after", 0.0)), contain, c.timeout)
            cleanups.append(second)
            if "before" in conc:  # the other run starts first (and so owns what it creates)
                second.start()
                time.sleep(float(conc["before"]))
            else:
                hooks.delayed.append(second)
        limits = c.setup.get("launcher_limits")
        if limits:
            lim = LauncherLimits(f"{os.getpid()}-{root.name[-8:]}", limits.get("pids"), limits.get("memory"))
            cleanups.append(lim)
            hooks.preexec.append(lim.preexec)
        if c.setup.get("launcher_user") == "nobody":
            for d in ("log", "scratch"):
                for dirpath, _, filenames in os.walk(root / d):
                    os.chown(dirpath, NOBODY, NOBODY)
                    for name in filenames:
                        os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)
            hooks.preexec.append(become_nobody)
        result, pgid = launch(argv, env, values["work"], c, contain, fx.get("tty"), root, status, hooks)
        fx["launcher"] = {"returncode": result.returncode, "elapsed": hooks.elapsed, "timed_out": result.timed_out}
        if ctx.start_marker is not None:
            result.agent_started = os.path.lexists(ctx.start_marker)
            if result.agent_started:
                os.unlink(ctx.start_marker)  # not part of what the checks look at
        out_text = result.stdout + result.stderr
        if fx.get("tty"):
            time.sleep(0.1)
            out_text += bytes(fx["tty"].output).decode(errors="replace")
        # Checks first, from outside, while anything the run left behind is
        # still there to be seen (no_process_matching); then clean up.
        effect, checks = evaluate_checks(c, values, fx, out_text)
        contain.kill(pgid)
        time.sleep(0.1)
        refused = adapter.refusal(result)
        log_ok = True
        if c.effect_log is not None and not refused:
            log_ok, log_checks = evaluate_log(c, adapter, values, root, fx)
            checks += log_checks
        res = C.classify(c.kind, refused=refused, effect_observed=effect, log_ok=log_ok,
                         timed_out=result.timed_out)
        detail = "timed out; " if result.timed_out else ""
        n_effect = len(c.checks)
        effect_checks, log_checks = checks[:n_effect], checks[n_effect:]
        show = lambda chs: "; ".join(f"{ch['check']} {ch.get('arg', ch.get('want', ''))}" for ch in chs)  # noqa: E731
        if res == C.NOT_MITIGATED and effect:
            detail += "effect observed: " + show(effect_checks)
        elif res in (C.CONTROL_FAILED, C.ERROR):
            detail += show([ch for ch in effect_checks if not ch["held"]])
        failed_log = [ch for ch in log_checks if not ch["held"]]
        if failed_log and res in (C.NOT_MITIGATED, C.CONTROL_FAILED):
            detail += ("; " if detail else "") + "log: " + show(failed_log)
        detail = detail[:500]
        if refused:
            detail = result.stderr.strip().splitlines()[-1][:300] if result.stderr.strip() else "refused"
        return Outcome(c.id, c.kind, res, detail, result.returncode, round(time.monotonic() - start, 3),
                       result.stderr[-600:], checks, result.status_events, result.agent_started)
    except Exception as e:  # noqa: BLE001 - a broken run is an `error` result, never a crash of the lab
        return Outcome(c.id, c.kind, C.ERROR, f"{type(e).__name__}: {e}", seconds=time.monotonic() - start)
    finally:
        if contain is not None:
            contain.kill(None)
            contain.close()
        if values is not None:
            kill_token_processes(values["token"])
        if ctx is not None:
            try:
                adapter.cleanup(ctx)
            except Exception:  # noqa: BLE001
                pass
        for obj in reversed(cleanups):
            try:
                obj.close()
            except Exception:  # noqa: BLE001
                pass
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
