"""The old path of :mod:`lightning_ortho.callbacks.compression.transform_compression` (deprecated; removed in the next
minor release): configurations saved with ``class_path:
lightning_ortho.callbacks.transform_compression.TransformCompression`` still load, with a
``LightningOrthoDeprecationWarning``. Import ``TransformCompression`` from :mod:`lightning_ortho.callbacks`."""

from lightning_ortho._deprecation import moved_module

__getattr__ = moved_module(__name__, "lightning_ortho.callbacks.compression.transform_compression")
