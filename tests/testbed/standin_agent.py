"""A stand-in for the node agent that posts its environment, so tests/testbed/test_agents.py can
check what the testbed hands each agent (identity, token, state directory) and its start, freeze
and restart mechanics. The real agent against the real console in namespaces is exercised by
tests/integration/test_demo.py (emulated mode).

Every 0.1 s it POSTs {hostname, machine_id, token, cluster_id, pid, starts} as JSON to
$LOCKSTEP_CONSOLE_URL/api/v1/agent/heartbeat, and counts its starts in $LOCKSTEP_STATE_DIR.
"""

import json
import os
import time
import urllib.request
from pathlib import Path

state = Path(os.environ["LOCKSTEP_STATE_DIR"])
counter = state / "starts"
starts = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(starts))
body = {
    "hostname": os.environ["LOCKSTEP_HOSTNAME"], "machine_id": os.environ["LOCKSTEP_MACHINE_ID"],
    "token": os.environ["LOCKSTEP_ENROLL_TOKEN"], "cluster_id": os.environ.get("LOCKSTEP_CLUSTER_ID"),
    "pid": os.getpid(), "starts": starts, "state_dir": str(state),
}
url = os.environ["LOCKSTEP_CONSOLE_URL"].rstrip("/") + "/api/v1/agent/heartbeat"
print(f"stand-in agent {body['hostname']} posting to {url}", flush=True)
while True:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),  # noqa: S310 (a stub console)
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=2).read()  # noqa: S310 (the test's own console stub)
    except OSError as exc:
        print(f"post failed: {exc}", flush=True)
    time.sleep(0.1)
