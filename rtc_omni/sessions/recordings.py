"""Recordings of generations, kept for download after their session ends, bounded in count and bytes.

Each recording is capped at `max_bytes` (its recorder stops writing there), and at most
`max_recordings` are kept, so the store never holds more than max_recordings x max_bytes on disk.
When a new recording needs room, the oldest finished one is deleted; a recording still being
written is never touched, and when every place holds one, the new recording is refused.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

from ..media.recorder import Mp4Recorder


class RecordingsFull(Exception):
    """Every place in the store holds a recording still being written."""


class RecordingStore:
    """Maps session ids to the MP4 recorders (and files) of one folder."""

    def __init__(self, directory: str | None, max_recordings: int, max_bytes: int) -> None:
        self._owned = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="rtc-omni-recordings-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_recordings = max_recordings
        self.max_bytes = max_bytes
        self._recorders: OrderedDict[str, Mp4Recorder] = OrderedDict()  # oldest first

    def reserve(self, session_id: str, fps: float) -> Mp4Recorder:
        """A recorder for the session; RecordingsFull when every place holds a recording in progress."""
        while len(self._recorders) >= self.max_recordings:
            oldest = next((sid for sid, r in self._recorders.items() if r.finished), None)
            if oldest is None:
                raise RecordingsFull(
                    f"no room for another recording: {self.max_recordings} are being written (--max-recordings)"
                )
            self._recorders.pop(oldest).path.unlink(missing_ok=True)
        recorder = Mp4Recorder(self.directory / f"{session_id}.mp4", fps, max_bytes=self.max_bytes)
        self._recorders[session_id] = recorder
        return recorder

    def in_progress(self, session_id: str) -> bool:
        recorder = self._recorders.get(session_id)
        return recorder is not None and not recorder.finished

    def get(self, session_id: str) -> Path | None:
        """The finished recording's file, or None."""
        recorder = self._recorders.get(session_id)
        if recorder is None or not recorder.finished or not recorder.path.is_file():
            return None
        return recorder.path

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
