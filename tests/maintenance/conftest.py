"""Fixtures of the maintenance tests (helpers live in gc_helpers.py: a module named
``conftest`` is ambiguous when the whole suite runs)."""

from gc_helpers import small_windows

__all__ = ["small_windows"]
