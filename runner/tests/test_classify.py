"""Result classification: every outcome."""

import unittest

from runner import classify as C


class Classify(unittest.TestCase):
    def test_attack_outcomes(self):
        self.assertEqual(C.classify("attack", effect_observed=False), C.MITIGATED)
        self.assertEqual(C.classify("attack", effect_observed=True), C.NOT_MITIGATED)
        # effect not seen from outside but the log missed or misreported it
        self.assertEqual(C.classify("attack", effect_observed=False, log_ok=False), C.NOT_MITIGATED)
        # a hang without an effect proves nothing
        self.assertEqual(C.classify("attack", timed_out=True), C.ERROR)
        self.assertEqual(C.classify("attack", timed_out=True, effect_observed=True), C.NOT_MITIGATED)

    def test_control_outcomes(self):
        self.assertEqual(C.classify("control", effect_observed=True), C.PASSED)
        self.assertEqual(C.classify("control", effect_observed=False), C.CONTROL_FAILED)
        self.assertEqual(C.classify("control", effect_observed=True, log_ok=False), C.CONTROL_FAILED)
        self.assertEqual(C.classify("control", effect_observed=True, timed_out=True), C.CONTROL_FAILED)

    def test_precedence(self):
        for kind in ("attack", "control"):
            self.assertEqual(C.classify(kind, needs_feature=True, unsupported=True), C.NEEDS_FEATURE)
            self.assertEqual(C.classify(kind, unsupported=True, error=True), C.UNSUPPORTED)
            self.assertEqual(C.classify(kind, error=True, refused=True), C.ERROR)
            self.assertEqual(C.classify(kind, refused=True), C.REFUSED)

    def test_observed_effect_outranks_a_refusal(self):
        # An attack that succeeds and then prints `tartaros: ...` and exits
        # 78 did not meet a refusal: the effect is there to see.
        self.assertEqual(C.classify("attack", refused=True, effect_observed=True), C.NOT_MITIGATED)
        self.assertEqual(C.classify("attack", refused=True, effect_observed=True, timed_out=True), C.NOT_MITIGATED)
        # a control whose work happened was not refused either
        self.assertEqual(C.classify("control", refused=True, effect_observed=True), C.PASSED)
        self.assertEqual(C.classify("control", refused=True, effect_observed=False), C.REFUSED)

    def test_every_outcome_is_reachable(self):
        seen = {
            C.classify("attack"), C.classify("attack", effect_observed=True),
            C.classify("control", effect_observed=True), C.classify("control"),
            C.classify("attack", unsupported=True), C.classify("attack", refused=True),
            C.classify("attack", needs_feature=True), C.classify("attack", error=True),
        }
        self.assertEqual(seen, set(C.OUTCOMES))

    def test_bad_kind(self):
        with self.assertRaises(ValueError):
            C.classify("other")


if __name__ == "__main__":
    unittest.main()
