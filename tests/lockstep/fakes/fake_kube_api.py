"""A fake Kubernetes API server (named as such: the real one cannot run here).

It answers the calls the kubernetes scheduler plugin makes with objects shaped like a real
cluster's: a Kubeflow training-operator v1 ``PyTorchJob`` (the structure of the operator's
``pytorch-simple`` example, with the status block the operator writes), ``Secret`` and ``Pod``
creation (201 with the stored object, 409 ``AlreadyExists`` as a real API server answers a
duplicate name, with its Status body), and records every request for the test to inspect.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PYTORCHJOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "llm-pretrain", "namespace": "research", "uid": "5d0c1b7e-2a37-4a5e-9f4b-7d1a3c2e9b10",
                 "resourceVersion": "184467", "generation": 1, "creationTimestamp": "2026-11-30T21:04:11Z"},
    "spec": {
        "runPolicy": {"cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [
                {"name": "pytorch", "image": "registry.example/llm:2026.11", "imagePullPolicy": "IfNotPresent",
                 "command": ["lockstep", "run", "--", "torchrun", "--nnodes", "2", "--nproc-per-node", "8", "train.py"],
                 "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}},
            "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": {
                "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": {"containers": [
                    {"name": "pytorch", "image": "registry.example/llm:2026.11", "imagePullPolicy": "IfNotPresent",
                     "command": ["lockstep", "run", "--", "torchrun", "--nnodes", "2", "--nproc-per-node", "8", "train.py"],
                     "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                     "resources": {"limits": {"nvidia.com/gpu": 8}}}],
                    "nodeSelector": {"gpu": "h200"}}}},
        },
    },
    "status": {"conditions": [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
         "message": "PyTorchJob llm-pretrain is created.", "lastUpdateTime": "2026-11-30T21:04:11Z",
         "lastTransitionTime": "2026-11-30T21:04:11Z"},
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
         "message": "PyTorchJob llm-pretrain is running.", "lastUpdateTime": "2026-11-30T21:04:40Z",
         "lastTransitionTime": "2026-11-30T21:04:40Z"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}},
        "startTime": "2026-11-30T21:04:11Z"},
}


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeKubeAPI:
    def __init__(self, objects: dict | None = None):
        self.requests: list[tuple[str, str, dict | None]] = []
        self.pods: dict[str, dict] = {}
        self.secrets: dict[str, dict] = {}
        self.jobs = {("research", "llm-pretrain"): PYTORCHJOB}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self):
                n = int(self.headers.get("Content-Length", 0))
                return json.loads(self.rfile.read(n)) if n else None

            def do_GET(self):  # noqa: N802
                api.requests.append(("GET", self.path, None))
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["apis", "kubeflow.org", "v1"] and parts[5] == "pytorchjobs":
                    job = api.jobs.get((parts[4], parts[6]))
                    if job is None:
                        return self._send(404, _status(404, "NotFound", f'pytorchjobs.kubeflow.org "{parts[6]}" not found'))
                    return self._send(200, job)
                if parts[:2] == ["api", "v1"] and parts[4] == "pods" and len(parts) == 6:
                    pod = api.pods.get(parts[5])
                    if pod is None:
                        return self._send(404, _status(404, "NotFound", f'pods "{parts[5]}" not found'))
                    return self._send(200, pod)
                self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

            def do_POST(self):  # noqa: N802
                body = self._body()
                api.requests.append(("POST", self.path, body))
                parts = self.path.split("?")[0].strip("/").split("/")
                store = {"pods": api.pods, "secrets": api.secrets}.get(parts[-1])
                if store is None:
                    return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))
                name = body["metadata"]["name"]
                if name in store:
                    return self._send(409, _status(409, "AlreadyExists", f'{parts[-1]} "{name}" already exists'))
                obj = dict(body)
                obj["metadata"] = dict(body["metadata"], uid=str(uuid.uuid4()), resourceVersion="1",
                                       creationTimestamp="2026-12-01T10:00:00Z")
                if parts[-1] == "pods":
                    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
                store[name] = obj
                self._send(201, obj)

            def do_PUT(self):  # noqa: N802
                body = self._body()
                api.requests.append(("PUT", self.path, body))
                parts = self.path.strip("/").split("/")
                api.secrets[parts[-1]] = body
                self._send(200, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
