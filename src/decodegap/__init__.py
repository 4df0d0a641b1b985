"""decodegap: where every millisecond of an LLM decode step goes, and why.

    import decodegap
    a = decodegap.analyze(decodegap.EXAMPLE_TRACE)     # or a trace / folder of your own, model=..., gpu=...
    a.findings[0].title, a.kernels_df(), a.steps_df()
"""

__version__ = "0.1.0"

_API = ("analyze", "load", "diff", "run", "EXAMPLE_TRACE", "EXAMPLE_MODEL")


def __getattr__(name: str):
    # Lazy: `import decodegap` stays cheap (the CLI imports only what a command needs).
    if name in _API:
        from decodegap import api

        return getattr(api, name)
    if name == "Analysis":
        from decodegap.analysis import Analysis

        return Analysis
    raise AttributeError(f"module 'decodegap' has no attribute {name!r}")


__all__ = ["Analysis", "__version__", *_API]
