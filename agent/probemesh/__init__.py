"""The probe mesh: every NIC probes its planned peers over UDP and answers theirs.

Design (docs/agent-protocol.md, "Probe mesh", has the plan and the telemetry record):

- **Engines.** The hot loop is ``lockstep-probed`` (C, ``native/``, built by ``make native``), a
  subprocess speaking a line protocol; where it is not built the Python engine
  (:mod:`agent.probemesh.pyengine`) does the same at a capped rate, and the activity's health
  says so. Both speak one wire format (:mod:`agent.probemesh.wire`).
- **Probes.** Per peer one probe every ``interval_ms`` from a rotating source port of the
  NIC's set (sized to reach every ECMP path of a pair, :func:`agent.probemesh.plan.ports_for_paths`),
  bound to the NIC's address and interface, time-stamped by the kernel (``SO_TIMESTAMPING``:
  hardware where the NIC has it on, software otherwise; the TX stamp comes back on the error
  queue). The responder on each NIC echoes at once with its RX stamp, its send time, and the
  kernel TX stamp of its previous echo to that prober (a follow-up, as PTP's two-step).
- **Deadline.** A probe unanswered within max(floor, k x the pair's RTT p99 of its last window)
  is lost, judged on the network round trip (the responder's turnaround taken out: a busy host
  answering slowly is not network loss), settled as soon as its direction is known (a few
  intervals later), not after a long timeout; the window is sent ``deadline + grace`` after it
  ends.
- **Direction.** Each echo carries the responder's bitmap of the 64 sequence numbers before it
  that it received: a lost probe the responder had is the echo's loss (reverse direction), one
  it never had is the probe's (forward). What no later echo resolves (the pair went dark) is
  ``unresolved``; the responder also counts the probes it received per prober window
  (``received``), which settles those when both records are merged.
- **One-way delay.** From the cluster clock (``ctx.services["cluster_clock"]``) when both ends
  are synchronized (``owd_basis: "clock"``), half the network round trip otherwise
  (``"half_rtt"``: the responder's turnaround taken out).
- **Paths.** :mod:`agent.probemesh.paths`: TTL-limited probes of each flow, answered by the
  switches, mapped to link ids through the plan's ``routers``.
"""
