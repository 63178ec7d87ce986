"""Verdicts of consecutive windows -> incident actions, with hysteresis and deduplication.

One fault is one incident: a culprit (kind and name) opens an incident once it has been named in
`open_windows` of the last `open_span` windows (or once at `open_confidence` or more: a cable
that went dark does not wait a second window); every later window naming it updates that
incident; it resolves after `clear_windows` windows in a row without it. A culprit named again
within `reopen_s` of resolving reopens its incident rather than opening a new one, so a flapping
link is one incident with a timeline, not fifty.

State (a JSON-able dict the caller stores between windows):

    {"culprits": {"link:L3": {"hits": [1, 0, 1], "misses": 0, "open": true}, ...},
     "resolved": {"link:L3": <window start ns when it resolved>, ...}}

`step(state, start_ns, culprits)` returns the new state and the actions, in order:
`Action("open"|"reopen"|"update"|"resolve", key, culprit)`. Windows arrive in order (the caller
drops late ones); the time of a window is its `start_ns`, nothing reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hysteresis:
    open_windows: int = 2  # windows naming a culprit, within the last open_span, before it opens
    open_span: int = 3
    open_confidence: float = 0.9  # ... or one window naming it this confidently
    clear_windows: int = 5  # windows in a row without it before it resolves
    reopen_s: float = 300.0  # named again within this after resolving: the same incident reopens

    def __post_init__(self):
        if not 1 <= self.open_windows <= self.open_span:
            raise ValueError(f"open_windows {self.open_windows} must be in 1..open_span {self.open_span}")
        if self.clear_windows < 1:
            raise ValueError(f"clear_windows {self.clear_windows} must be at least 1")


@dataclass(frozen=True)
class Action:
    action: str  # open, reopen, update, resolve
    key: str
    culprit: dict = field(default_factory=dict)  # the verdict's culprit (kind, name, confidence, ...)


def culprit_key(culprit: dict) -> str:
    return f"{culprit['kind']}:{culprit['name']}"


def step(state: dict | None, start_ns: int, culprits: list[dict],
         settings: Hysteresis | None = None) -> tuple[dict, list[Action]]:
    """The state after one window's verdict culprits, and what to do about it."""
    s = settings or Hysteresis()
    tracked = {k: dict(v) for k, v in (state or {}).get("culprits", {}).items()}
    resolved = dict((state or {}).get("resolved", {}))
    named = {culprit_key(c): c for c in culprits}
    actions: list[Action] = []
    for key in sorted(set(tracked) | set(named)):
        entry = tracked.get(key) or {"hits": [], "misses": 0, "open": False}
        hit = key in named
        entry["hits"] = ([*entry["hits"], 1 if hit else 0])[-s.open_span:]
        entry["misses"] = 0 if hit else entry["misses"] + 1
        if entry["open"]:
            if hit:
                actions.append(Action("update", key, named[key]))
            elif entry["misses"] >= s.clear_windows:
                actions.append(Action("resolve", key))
                resolved[key] = start_ns
                tracked.pop(key, None)
                continue
        elif hit and (sum(entry["hits"]) >= s.open_windows or named[key].get("confidence", 0) >= s.open_confidence):
            entry["open"] = True
            was = resolved.pop(key, None)
            again = was is not None and start_ns - was <= s.reopen_s * 1e9
            actions.append(Action("reopen" if again else "open", key, named[key]))
        elif not any(entry["hits"]):
            tracked.pop(key, None)  # a one-off that never opened: forgotten
            continue
        tracked[key] = entry
    horizon = start_ns - s.reopen_s * 1e9
    resolved = {k: t for k, t in resolved.items() if t >= horizon}
    return {"culprits": tracked, "resolved": resolved}, actions
