"""The result of one check on one component, and the report a check command returns. Pure.

Every evaluated item is a :class:`Result`: a passed one says what was compared; a failed one
carries a DCGM-style failure code (``DCGM_FR_*`` where DCGM has one, ``LOCKSTEP_FR_*``
otherwise), DCGM's severity class (what an operator does about it) and a recommended action,
with the numbers compared (``evidence``) and the limits (``threshold``).

Statuses, worst first: ``error`` (the facts could not be read: never counted as passed),
``fail``, ``warn``, ``pass``, ``skip`` (not applicable here: a counter the GPU does not have).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REPORT_FORMAT = "lockstep.audit.node/v1"
STATUSES = ("error", "fail", "warn", "pass", "skip")
_RANK = {s: i for i, s in enumerate(STATUSES)}

# DCGM's dcgmErrorSeverity_t classes (dcgm_errors.h), lower-cased: what to do with the component.
SEVERITIES = ("none", "monitor", "isolate", "triage", "config", "reset")


@dataclass(frozen=True)
class Result:
    check: str  # dotted id: "gpu.ecc", "pcie.width", "nic.mtu", ...
    component: dict  # {"kind": "gpu"|"nic"|"pcie_bridge"|"host", "name": ..., more identifiers}
    status: str
    message: str
    code: str = ""
    severity: str = "none"
    action: str = ""
    evidence: dict = field(default_factory=dict)
    threshold: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if self.status in ("fail", "warn", "error") and not self.code:
            raise ValueError(f"{self.check}: a {self.status} result needs a failure code")

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"check": self.check, "component": self.component, "status": self.status,
                               "message": self.message}
        if self.code:
            out |= {"code": self.code, "severity": self.severity, "action": self.action}
        if self.evidence:
            out["evidence"] = self.evidence
        if self.threshold:
            out["threshold"] = self.threshold
        return out


def ok(check: str, component: dict, message: str, evidence: dict | None = None,
       threshold: dict | None = None) -> Result:
    return Result(check, component, "pass", message, evidence=evidence or {}, threshold=threshold or {})


def skip(check: str, component: dict, message: str) -> Result:
    return Result(check, component, "skip", message)


def bad(check: str, component: dict, status: str, code: str, severity: str, message: str, action: str,
        evidence: dict | None = None, threshold: dict | None = None) -> Result:
    return Result(check, component, status, message, code, severity, action, evidence or {}, threshold or {})


def worst(statuses) -> str:
    """The worst of some statuses (``pass`` when there are none or only skips)."""
    best = "pass"
    for s in statuses:
        if s != "skip" and _RANK[s] < _RANK[best]:
            best = s
    return best


def report(check: str, results: list[Result], *, hardware: str, facts: dict, errors: list[str]) -> dict:
    """The JSON object a check command returns (see notes/audit.md for the contract)."""
    items = [r.to_dict() for r in results]
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r.status] += 1
    return {
        "format": REPORT_FORMAT,
        "check": check,
        "hardware": hardware,
        "status": worst(r.status for r in results),
        "counts": counts,
        "results": items,
        "failures": [i for i in items if i["status"] in ("error", "fail", "warn")],
        "facts": facts,
        "errors": list(errors),
    }
