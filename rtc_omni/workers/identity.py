"""Who a worker is: its index, its siblings' private sockets, and the ids of the sessions it owns."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .slots import SessionSlots

# A session id made by worker 3 reads `w3.<128 random bits>`: the owner is in the id itself, so any
# worker can route a request for it without asking anyone (docs/deployment.md, "Several workers").
_OWNER = re.compile(r"^w(\d{1,4})\.")


@dataclass(frozen=True)
class Worker:
    """One worker of `rtc-omni serve --workers N` (index 0..N-1), as the parent forked it."""

    index: int
    count: int
    socket_dir: Path  # the parent's private folder (mode 0700) of the workers' Unix sockets
    token_key: bytes  # the session-token HMAC key, the same in every worker
    slots: SessionSlots

    @property
    def session_id_prefix(self) -> str:
        return f"w{self.index}."

    def owner_of(self, session_id: str) -> int | None:
        """The worker that made `session_id`; None for an id no worker made (it is then nobody's: 404)."""
        match = _OWNER.match(session_id)
        if match is None or int(match.group(1)) >= self.count:
            return None
        return int(match.group(1))

    def socket_path(self, index: int) -> Path:
        """Where worker `index` takes requests forwarded by its siblings."""
        return self.socket_dir / f"worker-{index}.sock"
