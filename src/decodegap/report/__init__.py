"""Renderers: turn result dataclasses into terminal text, Markdown or JSON. Only this package formats text."""
