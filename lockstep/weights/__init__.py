"""RL weight push: a trainer publishes versions of its weights; rollout replicas swap them in whole.

Trainer::

    pub = WeightPublisher(policy, host="0.0.0.0", streams=4, delta=True)
    ...
    pub.push(policy)            # returns once staged; delivered in the background

Rollout replica (any host)::

    replica = WeightReplica(("trainer-host", port))
    replica.wait_for_version()
    replica.bind(policy_copy)   # its parameters follow the running version
    while True:
        with replica.hold() as w:   # one version for the whole generation
            generate(policy_copy)   # w.version, w.tensors
"""

from lockstep.weights.publisher import PushFailed, PushHandle, WeightPublisher
from lockstep.weights.replica import WeightReplica, Weights

__all__ = ["PushFailed", "PushHandle", "WeightPublisher", "WeightReplica", "Weights"]
