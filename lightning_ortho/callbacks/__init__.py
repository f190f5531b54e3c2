"""Lightning callbacks (Jacobian determinants, invertibility, orthogonality, ...) live here."""

from lightning_ortho.callbacks.glow_images import GlowImageGrids
from lightning_ortho.callbacks.glow_invertibility import GlowInvertibilityCheck
from lightning_ortho.callbacks.transform_compression import TransformCompression

__all__ = ["GlowImageGrids", "GlowInvertibilityCheck", "TransformCompression"]
