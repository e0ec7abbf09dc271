"""Contract files: loading, validation and placeholder expansion."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .policy import Policy, PolicyError

CONTRACT_DIR = Path(__file__).resolve().parent / "contracts"

PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")

# Keys a [[check]] predicate may use (exactly one "primary" key per table).
CHECK_KINDS = {
    "exists",  # path exists (file, dir or symlink)
    "absent",  # path does not exist
    "contains",  # file at path contains `text`
    "not_contains",  # file at path absent or does not contain `text`
    "received",  # named host listener received at least one byte (or `text`)
    "process_dead",  # the runner's victim process is gone
    "process_alive",  # the runner's victim process still runs
    "tty_input",  # bytes injected into the launcher's terminal input contain `text`
    "output_contains",  # the sandbox's stdout+stderr contain `text`
    "count_at_least",  # directory at path holds at least `n` entries
    "no_process_matching",  # no host process has `text` in its command line
    "process_matching",  # some host process has `text` in its command line
    "mode",  # permission bits (st_mode & 0o7777) of path equal `value`
    "mtime",  # whole-second mtime of path equals `value`
    "xattr",  # path has extended attribute `name` (whose value contains `text`, if given)
    "inode_flags",  # FS_IOC_GETFLAGS of path has every bit of `value`
    "host_pty",  # the runner's other host terminal (setup.host_pty) received `text`
    "launcher_signaled",  # the launcher (the sandbox's top process) died of a signal
    "running_at",  # the launcher still ran `n` seconds after it started
    "exited_by",  # the launcher had exited within `n` seconds of its start
    "connections_at_least",  # the named listener accepted at least `n` connections
}
CHECK_EXTRA = {"text", "n", "value", "name"}

SETUP_KEYS = {
    "file", "dir", "symlink", "listener", "victim", "tty", "kill_after", "host_alias", "copy",
    "free_port", "remove_after",
    "hardlink",  # [{ path = P, target = Q }]: P is another name of the (already set up) file Q
    "host_pty",  # another terminal of the agent's user on the host: {host_pty}
    "unix_decoys",  # N listening unix sockets in {outside}/decoys, bound before the listeners
    "launcher_limits",  # { pids = N, memory = BYTES }: limits on the launcher's own cgroup
    "signals",  # [{ after = S, signal = "TERM" }]: signals to the launcher (the supervisor) only
    "kill_group_after",  # S: SIGKILL the launcher's whole process group (supervisor and helpers)
    "launcher_user",  # "nobody": start the sandbox as an ordinary user
    "concurrent",  # { cmd = "...", after = S | before = S }: a second run of the same sandbox and policy,
                   # started S s after the contract's run, or S s before it
    "log_tmpfs",  # "128k": the log directory is a tmpfs of that size (the log's filesystem fills up)
    "bind",  # [{ source = P, target = Q }]: the host shows P again at Q (mount --bind) during the run
}
# setup.file: `count = N` makes N files, `path` + "00000" ... (before the run: no create of theirs
# is in the log)
# fields / not_fields: {"target.bytes_up" = N}: (dotted) fields that must have these values / must be
# present, not null and not these values
LOG_RECORD_KEYS = {"kind", "path", "dest", "decision", "field", "value", "fields", "not_fields"}
EFFECT_LOG_KEYS = {
    "verify", "record", "must_not_contain", "tamper", "seal",
    "files_logged",  # DIR: every file in DIR after the run has a record with exactly its path
    "no_phantom",  # DIR: every record naming a path in DIR names a file that exists after the run
    "verify_not",  # an exit of `log verify` that must not be seen (e.g. 0 for a degraded log)
    "run_fails",  # true: the sandbox's own exit status is non-zero (it says its log is incomplete)
    "sealed",  # DIR: every regular file below DIR is in the seal's `files` with its size and SHA-256 on disk
}
TOP_KEYS = {
    "id", "title", "kind", "control", "expect", "cmd", "timeout", "policy", "setup",
    "check", "effect_log", "launcher_env", "category", "notes", "covers", "source", "best_effort",
}
TAMPER_KINDS = {
    "edit": 1, "remove": 1, "reorder": 1, "append": 1, "truncate_tail": 2, "drop_seal": 2,
}


class ContractError(ValueError):
    pass


@dataclass
class Contract:
    id: str
    title: str
    kind: str  # attack | control
    expect: str  # blocked | allowed
    cmd: str
    policy_raw: dict[str, Any]
    policy: Policy
    checks: list[dict[str, Any]]
    setup: dict[str, Any] = field(default_factory=dict)
    effect_log: dict[str, Any] | None = None
    launcher_env: dict[str, str] = field(default_factory=dict)
    control: str | None = None
    category: str = "misc"
    timeout: float = 20.0
    path: Path | None = None
    # Issue classes the contract covers (e.g. "12.1", "13"), and the peer
    # test files its technique was taken from.
    covers: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    # Run the sandbox in its best-effort mode (TartarOS: without --strict).
    best_effort: bool = False

    @property
    def listeners(self) -> list[dict[str, Any]]:
        return list(self.setup.get("listener", []))


def expand(text: str, values: dict[str, str]) -> str:
    """Replace {name} placeholders; `{{` and `}}` are literal braces."""
    if not isinstance(text, str):
        return text
    marker_l, marker_r = "\x00L", "\x00R"
    text = text.replace("{{", marker_l).replace("}}", marker_r)

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise ContractError(f"unknown placeholder {{{name}}}")
        return str(values[name])

    return PLACEHOLDER.sub(sub, text).replace(marker_l, "{").replace(marker_r, "}")


def placeholders_in(obj: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, str):
        out.update(PLACEHOLDER.findall(obj.replace("{{", "").replace("}}", "")))
    elif isinstance(obj, list):
        for x in obj:
            out |= placeholders_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            out |= placeholders_in(x)
    return out


def known_placeholders(setup: dict[str, Any]) -> set[str]:
    names = {"work", "outside", "home", "root", "scratch", "secret", "token", "log", "python", "lab_lib"}
    if setup.get("host_pty"):
        names.add("host_pty")
    if any(lst.get("tls") for lst in setup.get("listener", [])):
        names.add("lab_ca")  # the test CA that signed the TLS listeners' certificates
    for lst in setup.get("listener", []):
        names.add(f"port_{lst['name']}")
        names.add(f"addr_{lst['name']}")
    for name in setup.get("free_port", []):
        names.add(f"port_{name}")
    if setup.get("victim"):
        names.add("victim_pid")
    return names


def parse(raw: dict[str, Any], path: Path | None = None) -> Contract:
    where = f"{path.name}: " if path else ""

    def fail(msg: str) -> ContractError:
        return ContractError(where + msg)

    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise fail(f"unknown key(s) {sorted(unknown)}")
    for key in ("id", "title", "kind", "cmd"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise fail(f"missing or empty string {key!r}")
    cid = raw["id"]
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", cid):
        raise fail(f"id {cid!r} must be lower-case words joined by '-'")
    kind = raw["kind"]
    if kind not in ("attack", "control"):
        raise fail(f"kind must be attack or control, not {kind!r}")
    expect = raw.get("expect", "blocked" if kind == "attack" else "allowed")
    if (kind, expect) not in (("attack", "blocked"), ("control", "allowed")):
        raise fail(f"an {kind} expects {'blocked' if kind == 'attack' else 'allowed'}, not {expect!r}")
    if kind == "attack" and not isinstance(raw.get("control"), str):
        raise fail("an attack names the control beside it (control = \"id\")")
    try:
        policy = Policy.from_dict(raw.get("policy", {}))
    except PolicyError as e:
        raise fail(str(e)) from None
    setup = raw.get("setup", {})
    bad = set(setup) - SETUP_KEYS
    if bad:
        raise fail(f"unknown setup key(s) {sorted(bad)}")
    names = [lst.get("name") for lst in setup.get("listener", [])]
    for lst in setup.get("listener", []):
        if lst.get("proto") not in ("tcp", "udp", "unix"):
            raise fail("listener proto must be tcp, udp or unix")
        if not lst.get("name"):
            raise fail("listener needs a name")
    if len(set(names)) != len(names):
        raise fail("listener names must be unique")
    checks = raw.get("check", [])
    if not checks:
        raise fail("a contract needs at least one [[check]]")
    for chk in checks:
        primary = set(chk) & CHECK_KINDS
        if len(primary) != 1 or set(chk) - CHECK_KINDS - CHECK_EXTRA:
            raise fail(f"check {chk!r} must have exactly one of {sorted(CHECK_KINDS)}")
        (k,) = primary
        if k in ("contains", "not_contains", "tty_input", "output_contains") and "text" not in chk:
            if k not in ("tty_input", "output_contains"):
                raise fail(f"check {k} needs text")
        if k in ("received", "connections_at_least") and chk[k] not in names:
            raise fail(f"check received names unknown listener {chk[k]!r}")
        if k in ("process_dead", "process_alive") and not setup.get("victim"):
            raise fail(f"check {k} needs setup.victim = true")
        if k in ("count_at_least", "running_at", "exited_by", "connections_at_least") and not isinstance(chk.get("n"), (int, float)):
            raise fail(f"{k} needs a number n")
        if k in ("mode", "mtime", "inode_flags") and not isinstance(chk.get("value"), int):
            raise fail(f"check {k} needs an integer value")
        if k == "xattr" and not isinstance(chk.get("name"), str):
            raise fail("check xattr needs a name")
        if k == "host_pty" and not setup.get("host_pty"):
            raise fail("check host_pty needs setup.host_pty = true")
    for sig in setup.get("signals", []):
        if not isinstance(sig.get("after"), (int, float)) or not hasattr(__import__("signal"), "SIG" + str(sig.get("signal"))):
            raise fail(f"setup.signals entry {sig!r} needs after = seconds and signal = a name like TERM")
    conc = setup.get("concurrent")
    if conc is not None and not (isinstance(conc, dict) and isinstance(conc.get("cmd"), str)):
        raise fail("setup.concurrent is a table with cmd (and after = seconds)")
    if setup.get("launcher_user") not in (None, "nobody"):
        raise fail('setup.launcher_user is "nobody" (the only ordinary user the runner knows)')
    effect_log = raw.get("effect_log")
    if effect_log is not None:
        bad = set(effect_log) - EFFECT_LOG_KEYS
        if bad:
            raise fail(f"unknown effect_log key(s) {sorted(bad)}")
        for rec in effect_log.get("record", []):
            if set(rec) - LOG_RECORD_KEYS or "kind" not in rec:
                raise fail(f"effect_log record {rec!r}: keys are {sorted(LOG_RECORD_KEYS)} with kind required")
        for t in effect_log.get("tamper", []):
            if t not in TAMPER_KINDS:
                raise fail(f"unknown tamper {t!r}; one of {sorted(TAMPER_KINDS)}")
        if "verify" in effect_log and effect_log["verify"] not in (0, 1, 2, 3):
            raise fail("effect_log.verify is 0, 1, 2 or 3")
    launcher_env = raw.get("launcher_env", {})
    if not all(isinstance(v, str) for v in launcher_env.values()):
        raise fail("launcher_env values are strings")
    known = known_placeholders(setup)
    used = placeholders_in({k: v for k, v in raw.items() if k not in ("id", "title", "notes")})
    missing = used - known
    if missing:
        raise fail(f"unknown placeholder(s) {sorted(missing)}")
    covers = raw.get("covers", [])
    covers = [covers] if isinstance(covers, str) else covers
    source = raw.get("source", [])
    source = [source] if isinstance(source, str) else source
    if not all(isinstance(x, str) for x in covers + source):
        raise fail("covers and source are strings or lists of strings")
    if not isinstance(raw.get("best_effort", False), bool):
        raise fail("best_effort is true or false")
    timeout = raw.get("timeout", 20)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise fail("timeout must be a positive number of seconds")
    return Contract(
        id=cid,
        title=raw["title"],
        kind=kind,
        expect=expect,
        cmd=raw["cmd"],
        policy_raw=raw.get("policy", {}),
        policy=policy,
        checks=checks,
        setup=setup,
        effect_log=effect_log,
        launcher_env=launcher_env,
        control=raw.get("control"),
        category=raw.get("category", cid.split("-")[0]),
        timeout=float(timeout),
        path=path,
        covers=covers,
        source=source,
        best_effort=raw.get("best_effort", False),
    )


def load_file(path: Path) -> Contract:
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ContractError(f"{path.name}: {e}") from None
    c = parse(raw, path)
    if path.stem != c.id:
        raise ContractError(f"{path.name}: file name must be the id ({c.id}.toml)")
    return c


def load_all(directory: Path = CONTRACT_DIR) -> list[Contract]:
    contracts = [load_file(p) for p in sorted(directory.glob("*.toml"))]
    validate_set(contracts)
    return contracts


def validate_set(contracts: list[Contract]) -> None:
    ids = [c.id for c in contracts]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ContractError(f"duplicate contract id(s): {sorted(dup)}")
    by_id = {c.id: c for c in contracts}
    for c in contracts:
        if c.kind == "attack":
            ctl = by_id.get(c.control or "")
            if ctl is None:
                raise ContractError(f"{c.id}: its control {c.control!r} does not exist")
            if ctl.kind != "control":
                raise ContractError(f"{c.id}: its control {c.control!r} is not a control")


def select(contracts: list[Contract], pattern: str | None) -> list[Contract]:
    if not pattern:
        return contracts
    pats = [p.strip() for p in pattern.split(",") if p.strip()]
    return [c for c in contracts if any(fnmatch.fnmatchcase(c.id, p) for p in pats)]
