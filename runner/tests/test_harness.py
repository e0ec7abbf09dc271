"""Harness pieces: log tampering, record matching, and (as root) real runs of
a few contracts with no sandbox, where every attack must show its effect."""

import json
import os
import unittest

from runner import classify as C
from runner.adapters import get
from runner.adapters.tartaros import Tartaros
from runner.contract import TAMPER_KINDS, load_all, parse
from runner.checks import record_matches, tamper
from runner.harness import run_contract
from runner.launch import parse_status

LOG = [json.dumps({"kind": "genesis", "seq": 0, "prev": ""}),
       json.dumps({"kind": "exec", "seq": 1, "path": "/bin/true", "decision": "allowed"}),
       json.dumps({"kind": "open", "seq": 2, "path": "/s/key", "decision": "denied"}),
       json.dumps({"kind": "seal", "seq": 3, "cgroup_empty": True})]


class Tamper(unittest.TestCase):
    def test_each_tamper_changes_the_log(self):
        original = "\n".join(LOG) + "\n"
        for how in TAMPER_KINDS:
            out = tamper(LOG, how)
            self.assertNotEqual(out, original, how)
        self.assertEqual(tamper(LOG, "drop_seal").splitlines(), LOG[:-1])
        self.assertFalse(tamper(LOG, "truncate_tail").endswith("\n"))
        self.assertEqual(len(tamper(LOG, "append").splitlines()), len(LOG) + 1)
        self.assertEqual(len(tamper(LOG, "remove").splitlines()), len(LOG) - 1)
        self.assertIn("seal", tamper(LOG, "remove").splitlines()[-1])

    def test_two_line_log(self):
        two = [LOG[0], LOG[3]]
        self.assertEqual(tamper(two, "remove").splitlines(), [LOG[3]])
        self.assertEqual(tamper(two, "reorder").splitlines(), [LOG[3], LOG[0]])


class Records(unittest.TestCase):
    def test_match(self):
        rec = json.loads(LOG[2])
        self.assertTrue(record_matches(rec, {"kind": "open", "path": "s/key", "decision": "denied"}))
        self.assertTrue(record_matches(rec, {"kind": "create|open", "path": "key"}))
        self.assertFalse(record_matches(rec, {"kind": "open", "decision": "allowed"}))
        self.assertFalse(record_matches(rec, {"kind": "exec"}))
        self.assertTrue(record_matches(json.loads(LOG[3]), {"kind": "seal", "field": "cgroup_empty", "value": True}))
        relay = {"kind": "connect", "pid": 0, "target": {"bytes_up": 7, "via": "port-forward"}}
        self.assertTrue(record_matches(relay, {"kind": "connect", "fields": {"target.bytes_up": 7}}))
        self.assertFalse(record_matches(relay, {"kind": "connect", "fields": {"target.bytes_up": 8}}))
        self.assertFalse(record_matches(relay, {"kind": "connect", "not_fields": {"pid": 0}}))
        self.assertTrue(record_matches({**relay, "pid": 9}, {"kind": "connect", "not_fields": {"pid": 0}}))
        # a field that is absent cannot satisfy "must not be 0"
        self.assertFalse(record_matches({"kind": "connect"}, {"kind": "connect", "not_fields": {"pid": 0}}))
        genesis = {"kind": "genesis", "policy": {"max_processes": None, "max_memory": 1 << 30}}
        want = {"kind": "genesis", "not_fields": {"policy.max_processes": 0, "policy.max_memory": 0}}
        self.assertFalse(record_matches(genesis, want))  # null is no limit
        genesis["policy"]["max_processes"] = 4096
        self.assertTrue(record_matches(genesis, want))


class StatusLines(unittest.TestCase):
    def test_parse_status(self):
        text = '{"event":"started","pid":3}\nnot json\n[1]\n{"event":"exited","code":0}\n{"event":'
        self.assertEqual([e["event"] for e in parse_status(text)], ["started", "exited"])


# A stand-in for a sandbox that runs the command unconfined but keeps
# TartarOS's refusal rules: what matters here is who may claim a refusal.
FAKE_SUPERVISOR = """
import os, subprocess, sys, json
fd = int(sys.argv[1]); cmd = sys.argv[2]; mode = sys.argv[3]
def say(obj):
    os.write(fd, (json.dumps(obj) + "\\n").encode())
if mode == "refuse":
    say({"event": "refused", "code": 78, "reason": "policy", "field": None})
    print("tartaros: refused by policy", file=sys.stderr)
    sys.exit(78)
say({"event": "started", "pid": os.getpid(), "run_id": "fake", "label": None})
rc = subprocess.call(["/bin/sh", "-c", cmd], pass_fds=())
say({"event": "exited", "code": rc, "signal": None, "status": rc, "duration_ms": 1, "log_head": None,
     "log_complete": None})
sys.exit(rc)
"""


class FakeTartaros(Tartaros):
    name = "fake-tartaros"
    own_cgroup = False

    def __init__(self, status: bool, mode: str = "run"):
        self.status, self.mode = status, mode

    def status_channel(self) -> bool:
        return self.status

    def argv(self, policy, workdir, cmd, ctx=None):
        if self.status:
            return ["/usr/bin/python3", "-c", FAKE_SUPERVISOR, str(ctx.status_fd), cmd, self.mode]
        if ctx is not None and ctx.start_marker:
            cmd = f": > {ctx.start_marker}\n{cmd}"
        if self.mode == "refuse":
            return ["/bin/sh", "-c", "echo 'tartaros: refused by policy' >&2; exit 78"]
        return ["/bin/sh", "-c", cmd]


FAKED_REFUSAL = parse({
    "id": "x-faked-refusal", "title": "t", "kind": "attack", "control": "x-c",
    "cmd": "echo pwned > {outside}/pwned; echo 'tartaros: refused (not really)' >&2; exit 78",
    "policy": {"writable_roots": ["{work}"]}, "check": [{"exists": "{outside}/pwned"}],
})
QUIET_FAKE = parse({
    "id": "x-quiet-fake", "title": "t", "kind": "attack", "control": "x-c",
    "cmd": "echo 'tartaros: refused (not really)' >&2; exit 78",
    "policy": {"writable_roots": ["{work}"]}, "check": [{"exists": "{outside}/pwned"}],
})


def remove_lab_tmp() -> None:
    """Leave the host as found: the lab's run directory, when empty."""
    from runner.harness import LAB_TMP

    try:
        os.rmdir(LAB_TMP)
    except OSError:
        pass


@unittest.skipUnless(os.geteuid() == 0, "needs root (the lab's run directories)")
class Refusals(unittest.TestCase):
    tearDownClass = staticmethod(remove_lab_tmp)

    def test_an_attack_that_succeeds_then_fakes_a_refusal_is_not_mitigated(self):
        for status in (True, False):
            o = run_contract(FAKED_REFUSAL, FakeTartaros(status))
            self.assertEqual(o.result, C.NOT_MITIGATED, f"status channel {status}: {o.detail}")
            self.assertEqual(o.exit_code, 78)

    def test_a_faked_refusal_without_effect_is_not_a_refusal(self):
        for status in (True, False):
            o = run_contract(QUIET_FAKE, FakeTartaros(status))
            self.assertEqual(o.result, C.MITIGATED, f"status channel {status}: {o.detail}")

    def test_a_real_refusal_is_read_from_the_channel(self):
        for status in (True, False):
            o = run_contract(QUIET_FAKE, FakeTartaros(status, mode="refuse"))
            self.assertEqual(o.result, C.REFUSED, f"status channel {status}: {o.detail}")
            if status:
                self.assertEqual([e["event"] for e in o.status_events], ["refused"])
            else:
                self.assertIs(o.agent_started, False)

    @unittest.skipUnless(Tartaros().available(), "no tartaros binary (set TARTAROS_BIN)")
    def test_real_tartaros_refusal(self):
        refused = parse({
            "id": "x-refused", "title": "t", "kind": "attack", "control": "x-c", "cmd": "true",
            "policy": {"writable_roots": ["{work}"], "glob_read_denies": ["{outside}/*.conf"]},
            "check": [{"exists": "{outside}/pwned"}],
        })
        o = run_contract(refused, Tartaros())
        self.assertEqual(o.result, C.REFUSED, f"{o.detail} {o.stderr_tail}")
        self.assertNotEqual(o.agent_started, True)

    @unittest.skipUnless(Tartaros().available(), "no tartaros binary (set TARTAROS_BIN)")
    def test_real_tartaros_agent_exit_78_is_not_a_refusal(self):
        inside = parse({
            "id": "x-inside-fake", "title": "t", "kind": "attack", "control": "x-c",
            "cmd": "echo pwned > {work}/pwned; echo 'tartaros: refused (not really)' >&2; exit 78",
            "policy": {"writable_roots": ["{work}"]}, "check": [{"exists": "{work}/pwned"}],
        })
        o = run_contract(inside, Tartaros())
        self.assertEqual(o.result, C.NOT_MITIGATED, f"{o.detail} {o.stderr_tail}")
        o = run_contract(QUIET_FAKE, Tartaros())
        self.assertEqual(o.result, C.MITIGATED, f"{o.detail} {o.stderr_tail}")


@unittest.skipUnless(os.geteuid() == 0, "needs root (listeners on 127.0.0.53:53, cgroups)")
class BaselineRuns(unittest.TestCase):
    tearDownClass = staticmethod(remove_lab_tmp)

    """With no sandbox every attack's effect must be visible from outside and
    every control must pass: otherwise a contract could report `mitigated`
    for an attack that cannot work at all."""

    IDS = ("fs-write-outside", "fs-write-inside", "fs-read-denied", "net-udp-loopback", "net-resolve-hosts",
           "proc-kill-outside", "proc-kill-own", "env-secret-not-inherited", "env-passthrough",
           # one of each fixture the issue 12 contracts brought: an owned file
           # with metadata, another terminal and the own tty, a late socket in
           # another netns, decoys, signals to the launcher, a group kill, a
           # concurrent run
           "fs-meta-chmod-outside", "fs-meta-chattr-inside", "proc-other-terminal", "proc-tty-write",
           "net-unix-late-bound", "net-unix-other-netns", "net-unix-many-sockets", "proc-stop-cooperative",
           "proc-signal-supervisor", "proc-supervisor-group-killed", "fs-materialize-concurrent")

    def test_baseline(self):
        contracts = {c.id: c for c in load_all()}
        none = get("none")
        for cid in self.IDS:
            c = contracts[cid]
            o = run_contract(c, none)
            want = C.NOT_MITIGATED if c.kind == "attack" else C.PASSED
            self.assertEqual(o.result, want, f"{cid}: {o.detail} {o.stderr_tail}")

    def test_effect_log_contract_needs_feature(self):
        c = {c.id: c for c in load_all()}["el-verify-tamper"]
        self.assertEqual(run_contract(c, get("bwrap")).result, C.NEEDS_FEATURE)


if __name__ == "__main__":
    unittest.main()
