"""The orchestrator sends the agent only kinds the console stores (an unknown kind is refused by
the console and dropped by the agent). That the snapshot event arrives is
tests/lockstep/test_snapshot.py's."""

from console.telemetry.builtin import EVENT_KINDS
from lockstep.orchestrator.events import AGENT_KINDS


def test_every_kind_the_orchestrator_forwards_is_one_the_console_registers():
    assert set(EVENT_KINDS) >= AGENT_KINDS

