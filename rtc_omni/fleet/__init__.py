"""A fleet of gateways (`--node-id`, `--peer`, `--cluster-key`): several `rtc-omni serve` machines behind
one load balancer, with no shared store.

Every session id and ephemeral key names the node that made it (`n3.w1.<random>`, `nodes.py`), so
any gateway passes a request for another's session to its owner, over the relay the workers use
between themselves (workers/forwarding.py), signed with the cluster key (`signatures.py`).
docs/deployment.md, "A gateway fleet", tells how.
"""

from .nodes import Fleet

__all__ = ["Fleet"]
