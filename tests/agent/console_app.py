"""The real console's ASGI application, plus the telemetry kind only the agent tests post
(`test.sample`: any bounded object), so they can count their own records. `real_console.py`
serves this instead of `console.asgi:application`; nothing else differs."""

from console.asgi import application
from console.telemetry import kinds

kinds.register(kinds.TelemetryKind("test.sample", "A kind only the agent tests post.", validate=kinds.shape({})))

__all__ = ["application"]
