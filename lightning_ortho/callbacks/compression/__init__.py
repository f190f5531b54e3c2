"""The :class:`~lightning_ortho.callbacks.TransformCompression` callback (``transform_compression``) and its
helpers: which layers it compresses (``selection``), the metric it scores them with (``metric``) and its rich
table (``report``)."""
