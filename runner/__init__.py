"""TartarOS lab: a policy-neutral contract runner for sandboxes.

Run from the repository root: ``python3 -m runner list`` or
``python3 -m runner run --sandbox tartaros,bwrap``.
"""

RUNNER_VERSION = "0.1.0"
