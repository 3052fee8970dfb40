"""Finished recordings, kept for download after their session ends, with a bound on how many."""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path


class RecordingStore:
    """Maps session ids to MP4 files in one folder, deleting the oldest beyond `max_recordings`."""

    def __init__(self, directory: str | None, max_recordings: int) -> None:
        self._owned = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="rtc-omni-recordings-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_recordings = max_recordings
        self._paths: OrderedDict[str, Path] = OrderedDict()

    def reserve(self, session_id: str) -> Path:
        """The path a session records to; the oldest recording goes when the store is full."""
        while len(self._paths) >= self.max_recordings:
            _, oldest = self._paths.popitem(last=False)
            oldest.unlink(missing_ok=True)
        path = self.directory / f"{session_id}.mp4"
        self._paths[session_id] = path
        return path

    def get(self, session_id: str) -> Path | None:
        path = self._paths.get(session_id)
        return path if path is not None and path.is_file() else None

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
