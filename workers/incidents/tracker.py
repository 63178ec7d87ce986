"""Verdicts of consecutive windows -> incident actions, with hysteresis and deduplication.

Each window's verdict is judged on the evidence of a span (`Span`): the window itself and, for
short windows, the windows just before it (workers.incidents.evidence), so consecutive
verdicts share evidence. One fault is one incident:

- a culprit named at `open_confidence` or more opens at once (a cable that went dark, or a
  lossy one once its evidence has grown strong enough, does not wait for anything);
- a doubtful culprit (named, below `open_confidence`) opens once named in `confirm_spans`
  verdicts whose evidence does not overlap, all within `confirm_s` (verdicts that share their
  windows are not independent: a burst in one window is in each of them); so does a culprit of
  a kind in `confirm_kinds`, however confident: a host that stops answering for a moment (a
  scheduling stall of a loaded host) is not an incident, one that stays silent is;
- every later verdict naming it updates that incident; it resolves once `clear_s` have passed
  since the end of the last verdict naming it (by the ends of the windows judged since);
- a culprit named again within `reopen_s` of resolving reopens its incident rather than opening
  a new one, so a flapping link is one incident with a timeline, not fifty.

Times are the windows' own (ns); nothing reads a clock. State (a JSON-able dict the caller
stores between windows)::

    {"culprits": {"link:L3": {"hits": [[from_ns, end_ns], ...], "last_ns": end_ns, "open": true}, ...},
     "resolved": {"link:L3": <window end ns when it resolved>, ...}}

`step(state, span, culprits)` returns the new state and the actions, in order:
`Action("open"|"reopen"|"update"|"resolve", key, culprit)`. Windows arrive in order (the caller
drops late ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hysteresis:
    open_confidence: float = 0.9  # a culprit named this confidently opens at once
    confirm_spans: int = 2  # ... a doubtful one once named on this many spans of disjoint evidence
    confirm_s: float = 3.0  # ... within this long (the oldest evidence to the newest window's end)
    confirm_kinds: tuple[str, ...] = ("host",)  # culprits of these kinds always wait for that
    clear_s: float = 5.0  # not named for this long: resolved
    reopen_s: float = 300.0  # named again within this after resolving: the same incident reopens

    def __post_init__(self):
        if self.confirm_spans < 1:
            raise ValueError(f"confirm_spans {self.confirm_spans} must be at least 1")
        if self.confirm_s <= 0 or self.clear_s <= 0:
            raise ValueError(f"confirm_s {self.confirm_s} and clear_s {self.clear_s} must be positive")


@dataclass(frozen=True)
class Span:
    """The window [start_ns, end_ns) whose verdict this is, judged on the evidence since from_ns."""

    start_ns: int
    end_ns: int
    from_ns: int | None = None  # None: the window alone

    def __post_init__(self):
        if self.end_ns <= self.start_ns:
            raise ValueError(f"end_ns {self.end_ns} must be after start_ns {self.start_ns}")
        if self.from_ns is not None and self.from_ns > self.start_ns:
            raise ValueError(f"from_ns {self.from_ns} must not be after start_ns {self.start_ns}")

    @property
    def evidence_from_ns(self) -> int:
        return self.start_ns if self.from_ns is None else self.from_ns


@dataclass(frozen=True)
class Action:
    action: str  # open, reopen, update, resolve
    key: str
    culprit: dict = field(default_factory=dict)  # the verdict's culprit (kind, name, confidence, ...)


def culprit_key(culprit: dict) -> str:
    return f"{culprit['kind']}:{culprit['name']}"


def _confirmed(hits: list[list[int]], s: Hysteresis) -> bool:
    """Whether `confirm_spans` of the hits (oldest first, the newest last) have disjoint evidence."""
    count, boundary = 1, hits[-1][0]  # walking back from the newest: each must end by the next's start
    for start, end in reversed(hits[:-1]):
        if end <= boundary:
            count += 1
            boundary = start
            if count >= s.confirm_spans:
                return True
    return count >= s.confirm_spans


def _entry(value) -> dict | None:
    """A stored entry, or None when it is not one this version wrote (dropped: it starts over)."""
    hits = value.get("hits") if isinstance(value, dict) else None
    if not isinstance(hits, list) or not all(isinstance(h, list) and len(h) == 2 for h in hits):
        return None
    if not isinstance(value.get("last_ns"), int):
        return None
    return {"hits": [list(h) for h in hits], "last_ns": value["last_ns"], "open": bool(value.get("open"))}


def step(state: dict | None, span: Span, culprits: list[dict],
         settings: Hysteresis | None = None) -> tuple[dict, list[Action]]:
    """The state after one window's verdict culprits, and what to do about it."""
    s = settings or Hysteresis()
    tracked: dict[str, dict] = {}
    for key, value in (state or {}).get("culprits", {}).items():
        entry = _entry(value)
        if entry is None and isinstance(value, dict) and value.get("open"):
            entry = {"hits": [], "last_ns": span.start_ns, "open": True}  # an open one of before: it may clear
        if entry is not None:
            tracked[key] = entry
    resolved = dict((state or {}).get("resolved", {}))
    named = {culprit_key(c): c for c in culprits}
    horizon = span.end_ns - int(s.confirm_s * 1e9)
    actions: list[Action] = []
    for key in sorted(set(tracked) | set(named)):
        entry = tracked.get(key) or {"hits": [], "last_ns": span.end_ns, "open": False}
        if key in named:
            entry["hits"] = [h for h in entry["hits"] if h[0] >= horizon] + [[span.evidence_from_ns, span.end_ns]]
            entry["last_ns"] = span.end_ns
        if entry["open"]:
            if key in named:
                actions.append(Action("update", key, named[key]))
            elif span.end_ns - entry["last_ns"] >= s.clear_s * 1e9:
                actions.append(Action("resolve", key))
                resolved[key] = span.end_ns
                tracked.pop(key, None)
                continue
        elif key in named and ((named[key].get("confidence", 0) >= s.open_confidence
                                and named[key].get("kind") not in s.confirm_kinds) or _confirmed(entry["hits"], s)):
            entry["open"] = True
            was = resolved.pop(key, None)
            again = was is not None and span.end_ns - was <= s.reopen_s * 1e9
            actions.append(Action("reopen" if again else "open", key, named[key]))
        elif not any(h[0] >= horizon for h in entry["hits"]):
            tracked.pop(key, None)  # a doubtful one-off too old to be confirmed: forgotten
            continue
        tracked[key] = entry
    reopen_horizon = span.end_ns - s.reopen_s * 1e9
    resolved = {k: t for k, t in resolved.items() if t >= reopen_horizon}
    return {"culprits": tracked, "resolved": resolved}, actions
