"""Results-page table of benchmarks/peer_normflows.py: ``render(data)`` of its result JSON (the Glow flows beside normflows'), the
reproductions' shared table (final figures per method and seed, seconds per epoch, claims)."""

from __future__ import annotations

from benchmarks._render import render_reproduction as render

__all__ = ["render"]
