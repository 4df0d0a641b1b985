"""Rendering a Report: terminal text (rich), Markdown, JSON (the versioned contract)."""
