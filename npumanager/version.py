"""The package version, in a module of its own so every layer can read it without
importing the package root (which re-exports the client API)."""

from __future__ import annotations

__version__ = "0.1.0"
