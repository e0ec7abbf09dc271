"""Harness pieces: log tampering, record matching, and (as root) real runs of
a few contracts with no sandbox, where every attack must show its effect."""

import json
import os
import unittest

from runner import classify as C
from runner.adapters import get
from runner.contract import TAMPER_KINDS, load_all
from runner.harness import record_matches, run_contract, tamper

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


@unittest.skipUnless(os.geteuid() == 0, "needs root (listeners on 127.0.0.53:53, cgroups)")
class BaselineRuns(unittest.TestCase):
    """With no sandbox every attack's effect must be visible from outside and
    every control must pass: otherwise a contract could report `mitigated`
    for an attack that cannot work at all."""

    IDS = ("fs-write-outside", "fs-write-inside", "fs-read-denied", "net-udp-loopback", "net-resolve-hosts",
           "proc-kill-outside", "proc-kill-own", "env-secret-not-inherited", "env-passthrough")

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
