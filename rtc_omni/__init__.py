"""rtc-omni: a WebRTC media server for omni-modal AI models."""

from .app import create_app
from .config import Settings
from .engines import Engines, GenerateEngine, SyntheticEngine, SyntheticVideoEngine, UnderstandEngine
from .sessions.generate import GenerateSession
from .sessions.understand import UnderstandSession

__all__ = [
    "Engines",
    "GenerateEngine",
    "GenerateSession",
    "Settings",
    "SyntheticEngine",
    "SyntheticVideoEngine",
    "UnderstandEngine",
    "UnderstandSession",
    "create_app",
]
__version__ = "0.1.0"
