"""decodegap: where every millisecond of an LLM decode step goes, and why."""

__version__ = "0.1.0"
