"""The :class:`~lightning_ortho.callbacks.Monitor` base of every monitor and its helpers: where the probes come from
(``probes``), which modules are measured (``selection``), when (``schedule``), how the values are kept and logged
(``values``), the end-of-fit report (``report``) and the environment switch's part (``source``)."""
