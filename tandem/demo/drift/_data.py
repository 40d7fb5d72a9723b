"""Digits whose distribution shifted: the drift the learning-loop demo streams (pure numpy).

``Drift`` describes what changed in the field, e.g. a camera knocked a
pixel or two out of place: each image is translated by ``shift_px`` pixels
(a whole number drawn per axis from the range; one axis or both, either
sign), optionally rotated by up to ``rotation_deg`` and given Gaussian
``noise``. ``apply`` is seeded: the same seed draws the same shifted stream.

Why translation by default: the demo's cloud model was trained with
translation augmentation and its edge model without, so the edge model
falls (about 95% to 67% on digits moved 1 to 3 pixels) while the cloud
stays near 96%: the cloud's answers are then good labels for the examples
the fleet offloads, which is what the learning loop needs to show.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Drift"]

_SIDE = 28


@dataclass(frozen=True, kw_only=True)
class Drift:
    shift_px: tuple[int, int] = (1, 3)  # per-axis translation drawn from [low, high] pixels
    rotation_deg: float = 0.0  # each image rotated by a uniform angle in [-r, r]
    noise: float = 0.0  # std of Gaussian noise added to pixels in [0, 1]

    def __post_init__(self) -> None:
        low, high = self.shift_px
        if not 0 <= low <= high <= 6:
            raise ValueError(f"shift_px must be 0 <= low <= high <= 6, got {self.shift_px}")
        if not 0.0 <= self.rotation_deg <= 90.0 or not 0.0 <= self.noise <= 1.0:
            raise ValueError("rotation_deg must be in [0, 90] and noise in [0, 1]")

    def describe(self) -> str:
        parts = [f"shifted {self.shift_px[0]}-{self.shift_px[1]} px"]
        if self.rotation_deg:
            parts.append(f"rotated up to {self.rotation_deg:g} deg")
        if self.noise:
            parts.append(f"noise {self.noise:g}")
        return ", ".join(parts)

    def apply(self, images: np.ndarray, seed: int) -> np.ndarray:
        """``images`` (FP32 [N, 1, 28, 28] in [0, 1]) as the drifted field sees them."""
        rng = np.random.default_rng(seed)
        n = len(images)
        low, high = self.shift_px
        magnitude = rng.integers(low, high + 1, size=(n, 2))
        sign = rng.choice(np.array([-1, 1]), size=(n, 2))
        offsets = magnitude * sign
        one_axis = rng.random(n) < 0.5  # half the images move along one axis only
        offsets[one_axis, rng.integers(0, 2, size=int(one_axis.sum()))] = 0
        out = _translate(np.asarray(images, dtype=np.float32), offsets)
        if self.rotation_deg:
            out = _rotate(out, rng.uniform(-self.rotation_deg, self.rotation_deg, n))
        if self.noise:
            out = np.clip(out + rng.normal(0.0, self.noise, out.shape), 0.0, 1.0)
        return np.ascontiguousarray(out, dtype=np.float32)


def _translate(images: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    pad = int(np.abs(offsets).max(initial=0))
    padded = np.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.empty_like(images)
    for i, (dy, dx) in enumerate(offsets):
        top, left = pad - int(dy), pad - int(dx)
        out[i] = padded[i, :, top : top + _SIDE, left : left + _SIDE]
    return out


def _rotate(images: np.ndarray, angles_deg: np.ndarray) -> np.ndarray:
    """Bilinear rotation about the centre, zero fill."""
    yy, xx = np.mgrid[0:_SIDE, 0:_SIDE].astype(np.float32)
    centre = (_SIDE - 1) / 2.0
    out = np.empty_like(images)
    for i, angle in enumerate(np.deg2rad(angles_deg)):
        cos, sin = np.cos(angle), np.sin(angle)
        x0 = cos * (xx - centre) + sin * (yy - centre) + centre
        y0 = -sin * (xx - centre) + cos * (yy - centre) + centre
        x1, y1 = np.floor(x0).astype(int), np.floor(y0).astype(int)
        fx, fy = x0 - x1, y0 - y1
        image = np.pad(images[i, 0], 1)

        def pixel(y: np.ndarray, x: np.ndarray, image: np.ndarray = image) -> np.ndarray:
            inside = (y >= -1) & (y <= _SIDE) & (x >= -1) & (x <= _SIDE)
            return np.where(
                inside, image[np.clip(y + 1, 0, _SIDE + 1), np.clip(x + 1, 0, _SIDE + 1)], 0.0
            )

        out[i, 0] = (
            pixel(y1, x1) * (1 - fx) * (1 - fy)
            + pixel(y1, x1 + 1) * fx * (1 - fy)
            + pixel(y1 + 1, x1) * (1 - fx) * fy
            + pixel(y1 + 1, x1 + 1) * fx * fy
        )
    return out
