"""The capture engine: stage a state quickly into shared host memory, drain it in the background.

Used by :mod:`lockstep.checkpoint` (DCP checkpoints), :mod:`lockstep.weights` (RL weight push)
and the job snapshots of the injected runtime. See :mod:`lockstep.capture.engine`.
"""

from lockstep.capture.arena import Arena, Layout, Slot
from lockstep.capture.engine import CaptureFailed, CaptureHandle, CaptureInFlight, Engine

__all__ = ["Arena", "CaptureFailed", "CaptureHandle", "CaptureInFlight", "Engine", "Layout", "Slot"]
