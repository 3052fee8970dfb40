"""`rtc-omni serve --workers N`: pre-forked worker processes sharing one HTTP port.

The parent (`supervisor.py`) binds the port, forks the workers and watches them, restarting one that
dies (`restarts.py`; with --engine vllm, after it started the one engine process they share:
`engine_process.py`); each worker (`identity.py`) is a whole server that owns the media of the
sessions it answered, and passes a request for another worker's session to that worker
(`forwarding.py`), and answers a scrape of /metrics with every worker's figures (`scrape.py`).
docs/deployment.md tells how.
"""

from .identity import Worker
from .slots import SessionSlots

__all__ = ["SessionSlots", "Worker"]
