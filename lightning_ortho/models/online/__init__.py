"""The parts of :class:`~lightning_ortho.models.OnlineRNNModule` (and of its subclass for ``LRUStack``): the state
carried between chunks (``carry``), one chunk of online steps (``chunk``), the estimator it trains with
(``estimators``), validation and test (``evaluation``), the readout and its per-step form (``readout``,
``readout_step``), and the CPU thread count of a run (``stage_threads``)."""
