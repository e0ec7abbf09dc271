"""Running one contract against one sandbox, in fresh directories."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import classify as C
from .adapters.base import Adapter, Context, RunResult, Unsupported
from .contract import TAMPER_KINDS, Contract, expand
from .hostfx import (BareNetns, Containment, DelayedListener, HostAliases, HostPty, LauncherLimits, Listener,
                     LogTmpfs, Terminal, UnixDecoys, Victim, processes_matching)

LAB_TMP = os.environ.get("TARTAROS_LAB_TMP", "/var/lib/tartaros-lab")
SANDBOX_PYTHON = "/usr/bin/python3"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Helper programs contracts copy into their tree (setup.copy from "{lab_lib}/...").
LAB_LIB = str(Path(__file__).resolve().parent / "contracts" / "lib")
NOBODY = 65534
FS_IOC_GETFLAGS = 0x80086601


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
        p = Path(ex(f["path"]))
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


def evaluate_checks(c: Contract, values: dict[str, str], fx: dict[str, Any], out_text: str) -> tuple[bool, list[dict]]:
    ex = lambda s: expand(s, values)  # noqa: E731
    results = []
    for chk in c.checks:
        (kind,) = set(chk) & set(C_CHECKS)
        arg = chk[kind]
        text = ex(chk["text"]) if "text" in chk else None
        ok = False
        if kind == "exists":
            ok = os.path.lexists(ex(arg))
        elif kind == "absent":
            ok = not os.path.lexists(ex(arg))
        elif kind in ("contains", "not_contains"):
            try:
                found = text in Path(ex(arg)).read_text(errors="replace")
            except OSError:
                found = False
            ok = found if kind == "contains" else not found
        elif kind == "received":
            got = fx["listeners"][arg].received()
            ok = (text.encode() in got) if text is not None else len(got) > 0
        elif kind == "process_dead":
            ok = not fx["victim"].alive()
        elif kind == "process_alive":
            ok = fx["victim"].alive()
        elif kind == "tty_input":
            term = fx.get("tty")
            got = bytes(term.injected) if term else b""
            ok = (text.encode() in got) if text else len(got) > 0
        elif kind == "output_contains":
            ok = text in out_text
        elif kind == "count_at_least":
            try:
                ok = len(os.listdir(ex(arg))) >= chk["n"]
            except OSError:
                ok = False
        elif kind == "no_process_matching":
            ok = not processes_matching(ex(arg), {os.getpid()})
        elif kind == "process_matching":
            ok = bool(processes_matching(ex(arg), {os.getpid()}))
        elif kind in ("mode", "mtime"):
            try:
                st = os.lstat(ex(arg))
                ok = (st.st_mode & 0o7777 if kind == "mode" else int(st.st_mtime)) == chk["value"]
            except OSError:
                ok = False
        elif kind == "xattr":
            try:
                value = os.getxattr(ex(arg), chk["name"], follow_symlinks=False)
                ok = text is None or text.encode() in value
            except OSError:
                ok = False
        elif kind == "inode_flags":
            ok = (inode_flags(ex(arg)) & chk["value"]) == chk["value"]
        elif kind == "host_pty":
            got = fx["host_pty"].received() if "host_pty" in fx else b""
            ok = (text.encode() in got) if text else len(got) > 0
        elif kind == "connections_at_least":
            got_n = fx["listeners"][arg].connections
            ok = got_n >= chk["n"]
            text = f"{got_n} connections"
        elif kind == "launcher_signaled":
            rc = fx.get("launcher", {}).get("returncode")
            ok = rc is not None and rc < 0
        elif kind == "running_at":
            la = fx.get("launcher", {})
            ok = la.get("timed_out", False) or la.get("elapsed", 0.0) >= chk["n"]
        elif kind == "exited_by":
            la = fx.get("launcher", {})
            ok = not la.get("timed_out", True) and la.get("elapsed", 1e9) <= chk["n"]
        results.append({"check": kind, "arg": ex(arg) if isinstance(arg, str) else arg, "held": ok,
                        **({"got": text} if kind == "connections_at_least" else {})})
    return all(r["held"] for r in results), results


C_CHECKS = (
    "exists", "absent", "contains", "not_contains", "received", "process_dead", "process_alive",
    "tty_input", "output_contains", "count_at_least", "no_process_matching", "process_matching",
    "mode", "mtime", "xattr", "inode_flags", "host_pty", "launcher_signaled", "running_at", "exited_by",
    "connections_at_least",
)


def inode_flags(path: str) -> int:
    """FS_IOC_GETFLAGS (chattr's flags) of a file, 0 when it cannot be read."""
    import array
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        return buf[0]
    except OSError:
        return 0
    finally:
        os.close(fd)


def read_log(path: str) -> list[dict[str, Any]]:
    recs = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except json.JSONDecodeError:
                        recs.append({"_unparsed": line})
    except OSError:
        pass
    return recs


def record_kind(rec: dict[str, Any]) -> str | None:
    for k in ("kind", "type", "event"):
        if isinstance(rec.get(k), str):
            return rec[k]
    return None


def record_path(rec: dict[str, Any]) -> str | None:
    """The (kernel-sourced, where the record has both) path a record names."""
    for where in (rec, rec.get("target") if isinstance(rec.get("target"), dict) else {}):
        if isinstance(where.get("path"), str):
            return where["path"]
    return None


def record_matches(rec: dict[str, Any], want: dict[str, Any]) -> bool:
    if record_kind(rec) not in want["kind"].split("|"):
        return False
    flat = json.dumps(rec, sort_keys=True)
    for key in ("path", "dest"):
        if key in want and want[key] not in flat:
            return False
    if "decision" in want and rec.get("decision", rec.get("verdict")) != want["decision"]:
        return False
    if "field" in want and rec.get(want["field"]) != want.get("value"):
        return False
    return True


def tamper(lines: list[str], how: str) -> str:
    """A tampered copy of a log (as text), for `log verify`'s exit codes."""
    body = list(lines)
    mid = max(1, len(body) // 2)
    if how == "edit":
        rec = json.loads(body[mid])
        rec["seq"] = rec.get("seq", 0)
        rec["lab_edit"] = 1
        body[mid] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    elif how == "remove":  # a line that is not the last (dropping the seal is drop_seal)
        del body[mid if mid < len(body) - 1 else 0]
    elif how == "reorder":
        body[mid], body[mid - 1] = body[mid - 1], body[mid]
    elif how == "append":
        rec = json.loads(body[-1])
        rec["seq"] = rec.get("seq", 0) + 1
        body.append(json.dumps(rec, sort_keys=True, separators=(",", ":")))
    elif how == "truncate_tail":
        text = "\n".join(body) + "\n"
        return text[: len(text) - max(5, len(body[-1]) // 2)]
    elif how == "drop_seal":
        body = body[:-1]
    return "\n".join(body) + "\n"


def evaluate_log(c: Contract, adapter: Adapter, values: dict[str, str], root: Path,
                 fx: dict[str, Any] | None = None) -> tuple[bool, list[dict]]:
    spec = c.effect_log or {}
    ex = lambda s: expand(s, values)  # noqa: E731
    path = values["log"]
    out: list[dict] = []
    recs = read_log(path)
    out.append({"check": "log-present", "held": bool(recs)})
    code, msg = adapter.verify_log(path)  # type: ignore[attr-defined]
    if "verify" in spec or "verify_not" not in spec:
        want_verify = spec.get("verify", 0)
        out.append({"check": "verify", "want": want_verify, "got": code, "held": code == want_verify,
                    "msg": msg[-300:]})
    if "verify_not" in spec:
        out.append({"check": "verify_not", "want": f"not {spec['verify_not']}", "got": code,
                    "held": code is not None and code != spec["verify_not"], "msg": msg[-300:]})
    if spec.get("run_fails"):
        rc = (fx or {}).get("launcher", {}).get("returncode")
        out.append({"check": "run_fails", "got": rc, "held": rc not in (0, None)})
    if "files_logged" in spec:
        d = ex(spec["files_logged"])
        logged = {record_path(r) for r in recs}
        try:
            names = sorted(os.listdir(d))
        except OSError:
            names = []
        missing = [n for n in names if os.path.join(d, n) not in logged]
        out.append({"check": "files_logged", "arg": d, "held": bool(names) and not missing,
                    "msg": f"{len(names)} files, {len(missing)} without a record: {missing[:5]}"})
    if "no_phantom" in spec:
        d = ex(spec["no_phantom"]).rstrip("/") + "/"
        named = {p for p in map(record_path, recs) if p and p.startswith(d)}
        phantoms = sorted(p for p in named if not os.path.lexists(p))
        out.append({"check": "no_phantom", "arg": d, "held": not phantoms,
                    "msg": f"{len(phantoms)} records name files that never existed: {phantoms[:5]}"})
    for want in spec.get("record", []):
        w = {k: (ex(v) if isinstance(v, str) else v) for k, v in want.items()}
        out.append({"check": "record", "want": w, "held": any(record_matches(r, w) for r in recs)})
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        text = ""
    for s in spec.get("must_not_contain", []):
        s = ex(s)
        out.append({"check": "must_not_contain", "arg": s, "held": s not in text})
    seal = spec.get("seal")
    if seal is not None:
        last = recs[-1] if recs else {}
        held = record_kind(last) == "seal" and all(last.get(k) == v for k, v in seal.items())
        out.append({"check": "seal", "want": seal, "held": held})
    lines = [line for line in text.splitlines() if line.strip()]
    for how in spec.get("tamper", []):
        if len(lines) < 2:
            out.append({"check": f"tamper-{how}", "held": False, "msg": "log too short to tamper"})
            continue
        tp = root / "log" / f"tampered-{how}.jsonl"
        tp.write_text(tamper(lines, how))
        code, msg = adapter.verify_log(str(tp))  # type: ignore[attr-defined]
        want = TAMPER_KINDS[how]
        out.append({"check": f"tamper-{how}", "want": want, "got": code, "held": code == want})
    return all(r["held"] for r in out), out


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
                lst = Listener(spec["name"], spec["proto"], host, int(spec.get("port", 0)), path,
                               netns=netns, hold=bool(spec.get("hold")))
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
