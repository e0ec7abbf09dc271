"""Contract files: all parse, ids unique, every attack has a control; placeholders."""

import unittest

from runner.contract import (ContractError, expand, load_all, parse, placeholders_in, select, validate_set)
from runner.policy import Policy, PolicyError


def minimal(**over):
    raw = {"id": "x-one", "title": "t", "kind": "control", "cmd": "true", "check": [{"exists": "{work}/a"}]}
    raw.update(over)
    return raw


class ContractFiles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.contracts = load_all()

    def test_at_least_40_and_ids_unique(self):
        self.assertGreaterEqual(len(self.contracts), 40)
        ids = [c.id for c in self.contracts]
        self.assertEqual(len(ids), len(set(ids)))

    def test_every_attack_has_a_control(self):
        by_id = {c.id: c for c in self.contracts}
        for c in self.contracts:
            if c.kind == "attack":
                self.assertEqual(by_id[c.control].kind, "control", c.id)
                self.assertEqual(c.expect, "blocked")
            else:
                self.assertEqual(c.expect, "allowed")

    def test_areas_covered(self):
        cats = {c.category for c in self.contracts}
        self.assertTrue({"fs", "proc", "net", "env", "el"} <= cats, cats)
        self.assertGreaterEqual(len([c for c in self.contracts if c.effect_log is not None]), 13)

    def test_every_class_of_issue_12_has_an_attack_beside_its_control(self):
        by_id = {c.id: c for c in self.contracts}
        for cls in [f"12.{i}" for i in range(1, 13)]:
            attacks = [c for c in self.contracts if cls in c.covers and c.kind == "attack"]
            self.assertTrue(attacks, f"no attack covers {cls}")
            for a in attacks:
                self.assertEqual(by_id[a.control].kind, "control", a.id)

    def test_issue_13_has_effect_log_contracts(self):
        ids = {c.id for c in self.contracts if "13" in c.covers and c.effect_log is not None}
        self.assertTrue({"el-mknod-logged", "el-racing-path", "el-degraded-capture"} <= ids, ids)

    def test_peer_derived_attacks_cite_their_source(self):
        for c in self.contracts:
            if c.kind == "attack" and c.covers and not c.id.startswith("fs-absent"):
                self.assertTrue(c.source, f"{c.id} covers {c.covers} but cites no source")

    def test_lab_lib_helpers_exist(self):
        import os
        from runner.harness import LAB_LIB
        for c in self.contracts:
            for cp in c.setup.get("copy", []):
                if cp["from"].startswith("{lab_lib}/"):
                    self.assertTrue(os.path.exists(cp["from"].replace("{lab_lib}", LAB_LIB)), c.id)

    def test_check_placeholders_are_known(self):
        # parse() already rejects unknown placeholders; make sure each one expands
        for c in self.contracts:
            values = {n: "V" for n in placeholders_in(c.cmd) | placeholders_in(c.checks)}
            expand(c.cmd, values)

    def test_select(self):
        self.assertTrue(all(c.id.startswith("fs-") for c in select(self.contracts, "fs-*")))
        self.assertEqual([c.id for c in select(self.contracts, "fs-write-outside")], ["fs-write-outside"])


class Gate(unittest.TestCase):
    def test_not_asserted_classes_leave_the_gate(self):
        from runner.__main__ import gate_failures

        cs = [parse(minimal(id="a-1", kind="attack", control="c-1", covers="12.1")), parse(minimal(id="c-1")),
              parse(minimal(id="b-1", kind="attack", control="c-1", covers=["13", "peers"]))]
        doc = {"sandbox": "tartaros", "results": [
            {"contract": "a-1", "result": "not-mitigated"}, {"contract": "c-1", "result": "control-failed"},
            {"contract": "b-1", "result": "mitigated"}]}
        bad, waived = gate_failures([doc], cs, "tartaros", "")
        self.assertEqual(len(bad), 2)
        bad, waived = gate_failures([doc], cs, "tartaros", "12.1")
        self.assertEqual((bad, waived), (["tartaros/c-1: control-failed"], ["tartaros/a-1: not-mitigated"]))
        bad, waived = gate_failures([doc], cs, "tartaros", "*")
        self.assertEqual(bad, ["tartaros/c-1: control-failed"])  # no covers: always asserted
        self.assertEqual(gate_failures([doc], cs, "bwrap", ""), ([], []))


class Validation(unittest.TestCase):
    def test_rejects(self):
        bad = [
            minimal(kind="other"),
            minimal(kind="attack"),  # no control named
            minimal(kind="attack", control="y", expect="allowed"),
            minimal(check=[]),
            minimal(check=[{"exists": "a", "absent": "b"}]),
            minimal(cmd="echo {nope}"),
            minimal(policy={"writable_root": ["/w"]}),
            minimal(policy={"read_scope": "some"}),
            minimal(policy={"max_processes": 0}),
            minimal(check=[{"received": "ghost"}]),
            minimal(check=[{"process_dead": "victim"}]),
            minimal(effect_log={"tamper": ["shuffle"]}),
            minimal(effect_log={"record": [{"path": "x"}]}),
            minimal(id="Bad_Id"),
            minimal(surprise=1),
        ]
        for raw in bad:
            with self.assertRaises(ContractError, msg=repr(raw)):
                parse(raw)

    def test_set_validation(self):
        atk = parse(minimal(id="a-1", kind="attack", control="c-1"))
        ctl = parse(minimal(id="c-1"))
        validate_set([atk, ctl])
        with self.assertRaises(ContractError):
            validate_set([atk])
        with self.assertRaises(ContractError):
            validate_set([ctl, parse(minimal(id="c-1"))])
        with self.assertRaises(ContractError):
            validate_set([atk, parse(minimal(id="c-1", kind="attack", control="a-1"))])

    def test_listener_and_victim_placeholders(self):
        c = parse(minimal(cmd="kill {victim_pid}; nc 127.0.0.1 {port_l}",
                          setup={"victim": True, "listener": [{"name": "l", "proto": "tcp"}]}))
        self.assertIn("{port_l}", c.cmd)


class Placeholders(unittest.TestCase):
    def test_expand(self):
        v = {"work": "/r/work", "port_x": "8080"}
        self.assertEqual(expand("{work}/a:{port_x}", v), "/r/work/a:8080")
        self.assertEqual(expand("awk '{{print $1}}' {work}", v), "awk '{print $1}' /r/work")
        self.assertEqual(expand("${HOME} { a; }", v), "${HOME} { a; }")
        with self.assertRaises(ContractError):
            expand("{outside}", v)

    def test_policy_expansion_and_ports(self):
        p = Policy.from_dict({"writable_roots": ["{work}"], "local_ports": ["{port_x}"],
                              "broker": {"port": "{port_x}", "token_env": "T"}})
        e = p.expanded(lambda s: expand(s, {"work": "/w", "port_x": "81"}))
        self.assertEqual(e.writable_roots, ["/w"])
        self.assertEqual(e.local_ports, [81])
        self.assertEqual(e.broker["port"], 81)
        self.assertEqual(p.writable_roots, ["{work}"])  # the original is untouched

    def test_policy_set_fields(self):
        self.assertEqual(Policy.from_dict({"writable_roots": ["/w"]}).set_fields(), ["writable_roots"])
        self.assertIn("inherit_env", Policy.from_dict({"inherit_env": False}).set_fields())
        with self.assertRaises(PolicyError):
            Policy.from_dict({"isolate_pids": "yes"})


if __name__ == "__main__":
    unittest.main()
