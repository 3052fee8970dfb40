"""rtc-omni: a WebRTC media server for omni-modal AI models."""

from .app import create_app
from .config import Settings
from .engines import SyntheticEngine, UnderstandEngine
from .sessions.understand import UnderstandSession

__all__ = ["Settings", "SyntheticEngine", "UnderstandEngine", "UnderstandSession", "create_app"]
__version__ = "0.1.0"
