"""Normalise diffusion outputs into uint8 RGB videos, with vLLM-Omni's exact value rules.

Engines hand back frames as torch tensors, numpy arrays or PIL images, batched or not, in
[-1, 1], [0, 1] or 0-255. This is the one place that turns all of them into (F, H, W, 3) uint8.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _ndim(value: Any) -> int | None:
    return getattr(value, "ndim", None)


def split_videos(videos: Any) -> list[Any]:
    """vLLM-Omni's splitting of one engine output into videos, so its engines' outputs play as upstream."""
    if videos is None:
        return []
    if _ndim(videos) == 5:
        return [videos[i] for i in range(videos.shape[0])]
    if isinstance(videos, list):
        if not videos:
            return []
        first = videos[0]
        if _ndim(first) == 5:
            flat: list[Any] = []
            for item in videos:
                flat.extend([item[i] for i in range(item.shape[0])] if _ndim(item) == 5 else [item])
            return flat
        if isinstance(first, list):
            return videos
        if _ndim(first) == 3:
            return [videos]
        return videos
    return [videos]


def _to_unit_float(frames: Any) -> np.ndarray:
    """Values in [0, 1] as float32, by the reference's dtype rules."""
    if _is_torch(frames):
        if frames.is_floating_point():
            # torch floats are always taken as [-1, 1] (the reference's rule, quirk 4.12.3).
            return ((frames.detach().float().clamp(-1, 1) * 0.5 + 0.5).cpu().numpy()).astype(np.float32)
        return frames.detach().cpu().numpy().astype(np.float32) / 255.0
    array = np.asarray(frames)
    if np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float32)
        if array.size and (array.min() < 0.0 or array.max() > 1.0):
            array = np.clip(array, -1.0, 1.0) * 0.5 + 0.5
        return array
    return array.astype(np.float32) / 255.0


def _channels_last(video: np.ndarray) -> np.ndarray:
    if video.ndim == 3:  # one frame (H, W, C)
        video = video[None]
    if video.ndim != 4:
        raise ValueError(f"a video must have 4 dimensions (frames, height, width, channels), got {video.shape}")
    if video.shape[-1] not in (1, 3, 4) and video.shape[0] in (1, 3, 4):  # (C, F, H, W)
        video = np.transpose(video, (1, 2, 3, 0))
    if video.shape[-1] == 1:
        video = np.repeat(video, 3, axis=-1)
    return video[..., :3]


def to_uint8_video(video: Any) -> np.ndarray:
    """One video in any accepted form as (F, H, W, 3) uint8."""
    if isinstance(video, np.ndarray) and video.dtype == np.uint8 and video.ndim == 4 and video.shape[-1] == 3:
        return video  # already what the track sends: no float round trip on the hot path
    if (
        isinstance(video, list)
        and video
        and all(isinstance(f, np.ndarray) and f.dtype == np.uint8 and f.ndim == 3 and f.shape[-1] == 3 for f in video)
    ):
        return np.stack(video)
    if isinstance(video, list):
        frames = [
            np.asarray(f.convert("RGB"), dtype=np.float32) / 255.0 if isinstance(f, Image.Image) else _to_unit_float(f)
            for f in video
        ]
        unit = np.stack([_channels_last(f)[0] for f in frames])
    elif isinstance(video, Image.Image):
        unit = np.asarray(video.convert("RGB"), dtype=np.float32)[None] / 255.0
    else:
        unit = _channels_last(_to_unit_float(video))
    return np.clip(np.rint(unit * 255.0), 0, 255).astype(np.uint8)


def normalize_videos(videos: Any) -> list[np.ndarray]:
    """Every video of an engine output as (F, H, W, 3) uint8."""
    return [to_uint8_video(v) for v in split_videos(videos)]
