"""Benchmarks and reproductions of lightning_ortho, run as ``python -m benchmarks.NAME`` from the repository root
(see benchmarks/_common.py). Not part of the installed package."""
