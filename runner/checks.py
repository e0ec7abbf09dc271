"""Checking a run from outside: the effect checks, and the effect log's
expectations (records, verify, tampering)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .adapters.base import Adapter
from .contract import TAMPER_KINDS, Contract, expand
from .hostfx import processes_matching

FS_IOC_GETFLAGS = 0x80086601


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
    if "field" in want and dotted(rec, want["field"]) != want.get("value"):
        return False
    if any(dotted(rec, k) != v for k, v in want.get("fields", {}).items()):
        return False
    # not_fields: present, not null, and not that value
    if any(dotted(rec, k) in (None, v) for k, v in want.get("not_fields", {}).items()):
        return False
    return True


def dotted(rec: dict[str, Any], key: str) -> Any:
    """rec["a"]["b"] for "a.b"; None when absent."""
    cur: Any = rec
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


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
        # Effects that happened: a refused attempt names what the agent asked
        # for, which need not exist (an open that failed with ENOENT).
        done = [r for r in recs if r.get("decision", "allowed") == "allowed"]
        named = {p for p in map(record_path, done) if p and p.startswith(d)}
        phantoms = sorted(p for p in named if not os.path.lexists(p))
        out.append({"check": "no_phantom", "arg": d, "held": not phantoms,
                    "msg": f"{len(phantoms)} records name files that never existed: {phantoms[:5]}"})
    if "sealed" in spec:
        d = ex(spec["sealed"])
        last = recs[-1] if recs else {}
        listed = {e.get("path"): e for e in last.get("files", [])} if record_kind(last) == "seal" else {}
        wrong = []
        # Every regular file below DIR, not only its own entries: a file
        # moved into a subdirectory changed what that name holds too.
        files = sorted(os.path.join(top, f) for top, _, fs in os.walk(d) for f in fs)
        for p in (f for f in files if os.path.isfile(f) and not os.path.islink(f)):
            name = os.path.relpath(p, d)
            data = Path(p).read_bytes()
            e = listed.get(p, {})
            if e.get("sha256") != hashlib.sha256(data).hexdigest() or e.get("size") != len(data):
                wrong.append(name)
        out.append({"check": "sealed", "arg": d, "held": os.path.isdir(d) and not wrong,
                    "msg": f"{len(wrong)} files not in the seal as they are on disk: {wrong[:5]}"})
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
