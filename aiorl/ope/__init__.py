"""Off-policy evaluation: what a policy would score, estimated from logged data alone.

EasyRL's four importance-sampling estimators (`aiorl.ope.importance`), per-decision doubly robust
(`aiorl.ope.doubly_robust`) and fitted Q evaluation (`aiorl.ope.fqe`), each with a bootstrap
interval over episodes (`aiorl.ope.bootstrap`); `aiorl.ope.report` runs them all. The guide:
docs/guides/off-policy-evaluation.md.
"""

from aiorl.ope.report import ESTIMATORS, NAMES, Estimate, estimate_all, evaluate_policy
from aiorl.ope.target import OpeError

__all__ = ["ESTIMATORS", "NAMES", "Estimate", "OpeError", "estimate_all", "evaluate_policy"]
