"""CPU of aiortc's SCTP receiver for 1-byte DATA chunks, in order and after one missing TSN.

Compares aiortc's own receive path with rtc-omni's bound (rtc_omni/patches/sctp.py), driving an
RTCSctpTransport in memory as tests/test_sctp_bound.py does (tests/sctp_memory.py). Figures: docs/upstream-sctp.md.
Usage (from the repository root): python -m benchmarks.sctp_reorder [CHUNKS]
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiortc.rtcsctptransport import RTCSctpTransport

from rtc_omni.patches import sctp
from tests.sctp_memory import FIRST_TSN, chunk, receiver, send


async def cpu_seconds(chunks: int, gap: bool) -> float:
    transport, _, _ = receiver()
    start = time.process_time()
    for i in range(1 if gap else 0, chunks):
        await send(transport, chunk(FIRST_TSN + i, i, b"x"))
    return time.process_time() - start


def main() -> None:
    chunks = int(sys.argv[1]) if len(sys.argv) > 1 else 12000
    for label, receive in (("aiortc", sctp.AIORTC_RECEIVE_DATA_CHUNK), ("bounded", sctp.receive_data_chunk_bounded)):
        RTCSctpTransport._receive_data_chunk = receive  # type: ignore[method-assign, assignment]
        in_order = asyncio.run(cpu_seconds(chunks, gap=False))
        after_gap = asyncio.run(cpu_seconds(chunks, gap=True))
        print(f"{label:8} {chunks} chunks: in order {in_order:.2f} CPU-s, after one missing TSN {after_gap:.2f} CPU-s")


if __name__ == "__main__":
    main()
