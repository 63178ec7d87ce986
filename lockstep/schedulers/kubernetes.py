"""``kubernetes``: a spare is a new pod, made from the job's own pod template.

Kubeflow PyTorchJob aware: when the job runs as a PyTorchJob (``LOCKSTEP_K8S_PYTORCHJOB``, or the
``training.kubeflow.org/job-name`` label of the orchestrator's own pod), the replacement pod is
built from the PyTorchJob's ``Worker`` replica template (``Master`` when it has no workers), owned
by the PyTorchJob (deleted with it) and labelled like its replicas; otherwise from the
orchestrator's own pod (``HOSTNAME``). The pod runs a node supervisor in join mode
(``python -m lockstep.orchestrator.node --join ...``) that starts the replacement and reports to
the orchestrator. The job token goes into a Secret (``lockstep-<job>``) the pod reads through
``secretKeyRef``: never in a pod spec. ``LOCKSTEP_K8S_SPARES`` (default 1) bounds how many
replacement pods the job may create; ``LOCKSTEP_K8S_NAMESPACE`` overrides the namespace.

Uses the official ``kubernetes`` client (``CoreV1Api``, ``CustomObjectsApi``); tests run it against
``tests/lockstep/fakes/fake_kube_api.py``, a fake API server answering with recorded objects.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os

from lockstep.schedulers import NoSpare

KUBEFLOW = ("kubeflow.org", "v1", "pytorchjobs")
JOB_LABEL = "training.kubeflow.org/job-name"
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _namespace() -> str:
    ns = os.environ.get("LOCKSTEP_K8S_NAMESPACE") or os.environ.get("POD_NAMESPACE")
    if ns:
        return ns
    try:
        with open(SA_NAMESPACE) as f:
            return f.read().strip()
    except OSError:
        return "default"


class KubernetesScheduler:
    name = "kubernetes"

    def __init__(self, orchestrator, *, api_client=None):
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.client = client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.orch = orchestrator
        self.namespace = _namespace()
        self.max_spares = int(os.environ.get("LOCKSTEP_K8S_SPARES", "1"))
        self.created: list[str] = []
        self.pytorchjob = os.environ.get("LOCKSTEP_K8S_PYTORCHJOB")
        self._own_pod = None

    # -- where the template comes from ------------------------------------------------------

    def own_pod(self):
        if self._own_pod is None and os.environ.get("HOSTNAME"):
            self._own_pod = self.core.read_namespaced_pod(os.environ["HOSTNAME"], self.namespace)
        return self._own_pod

    def job_object(self) -> dict | None:
        name = self.pytorchjob
        if not name:
            pod = self.own_pod()
            name = (pod.metadata.labels or {}).get(JOB_LABEL) if pod is not None else None
        if not name:
            return None
        group, version, plural = KUBEFLOW
        return self.custom.get_namespaced_custom_object(group, version, self.namespace, plural, name)

    def template(self) -> tuple[dict, dict | None]:
        """``(pod template as a dict, the PyTorchJob or None)``."""
        job = self.job_object()
        if job is not None:
            specs = job["spec"]["pytorchReplicaSpecs"]
            replica = specs.get("Worker") or specs.get("Master")
            if replica is None:
                raise NoSpare(f"PyTorchJob {job['metadata']['name']} has neither a Worker nor a Master replica spec")
            return copy.deepcopy(replica["template"]), job
        pod = self.own_pod()
        if pod is None:
            raise NoSpare("no PyTorchJob and no HOSTNAME pod to copy a spare pod from")
        d = self.core.api_client.sanitize_for_serialization(pod)
        return {"metadata": {"labels": d["metadata"].get("labels", {})}, "spec": d["spec"]}, None

    # -- the pod ----------------------------------------------------------------------------

    def secret_name(self) -> str:
        return f"lockstep-{self.orch.job}".lower().replace("_", "-")[:63]

    def ensure_secret(self):
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": self.secret_name(),
                "labels": {"lockstep.io/job": self.orch.job}},
                "type": "Opaque", "data": {"token": base64.b64encode(self.orch.token.encode()).decode()}}
        try:
            self.core.create_namespaced_secret(self.namespace, body)
        except self.client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
            self.core.replace_namespaced_secret(self.secret_name(), self.namespace, body)

    def pod_manifest(self, template: dict, job: dict | None, *, node: int, rank: int, generation: int,
                     incarnation: str) -> dict:
        name = f"{self.orch.job}-lockstep-r{rank}-g{generation}".lower().replace("_", "-")[:63]
        meta = template.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        labels.update({"lockstep.io/job": self.orch.job, "lockstep.io/rank": str(rank),
                       "lockstep.io/role": "replacement"})
        spec = copy.deepcopy(template["spec"])
        spec["restartPolicy"] = "Never"
        containers = spec["containers"]
        main = next((c for c in containers if c.get("name") == "pytorch"), containers[0])
        main["command"] = ["python", "-m", "lockstep.orchestrator.node", "--join", str(node), str(rank),
                           str(generation), incarnation]
        main.pop("args", None)
        env = [e for e in main.get("env", []) if not e["name"].startswith("LOCKSTEP_")]
        env += [
            {"name": "LOCKSTEP_JOB", "value": self.orch.job},
            {"name": "LOCKSTEP_ORCHESTRATOR", "value": f"{self.orch.host_for_nodes()}:{self.orch.port}"},
            {"name": "LOCKSTEP_LAUNCH", "value": os.environ.get("LOCKSTEP_LAUNCH", "{}")},
            {"name": "LOCKSTEP_JOB_TOKEN", "valueFrom": {"secretKeyRef": {"name": self.secret_name(), "key": "token"}}},
        ]
        main["env"] = env
        metadata = {"name": name, "namespace": self.namespace, "labels": labels,
                    "annotations": dict(meta.get("annotations") or {})}
        if job is not None:
            labels[JOB_LABEL] = job["metadata"]["name"]
            metadata["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                            "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                                            "controller": False, "blockOwnerDeletion": True}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    # -- the plugin interface ---------------------------------------------------------------

    def spare_count(self) -> int:
        return max(0, self.max_spares - len(self.created))

    def describe(self) -> dict:
        return {"kind": self.name, "namespace": self.namespace, "pytorchjob": self.pytorchjob,
                "created": list(self.created)}

    def _create(self, rank, generation, incarnation) -> dict:
        if self.spare_count() <= 0:
            raise NoSpare(f"no spare pod left for rank {rank}: {len(self.created)} created "
                          f"(LOCKSTEP_K8S_SPARES={self.max_spares})")
        template, job = self.template()
        self.ensure_secret()
        node = max([n for n in self.orch.nodes] + [self.orch.nnodes - 1]) + 1
        body = self.pod_manifest(template, job, node=node, rank=rank, generation=generation, incarnation=incarnation)
        try:
            pod = self.core.create_namespaced_pod(self.namespace, body)
        except self.client.exceptions.ApiException as exc:
            detail = exc.body if isinstance(exc.body, str) else json.dumps(exc.body)
            raise NoSpare(f"the Kubernetes API refused the spare pod for rank {rank}: {exc.status} {detail[:300]}") from None
        self.created.append(pod.metadata.name)
        return {"node": node, "pid": None, "host": pod.metadata.name}

    async def start_replacement(self, *, rank: int, generation: int, incarnation: str, lost_node) -> dict:
        return await asyncio.to_thread(self._create, rank, generation, incarnation)
