"""Reading Kineto (torch.profiler) Chrome traces into columnar tables, linking kernels to the ops that launched them.
The first stage: everything after it reads a `Trace`, never a file.

May import: decodegap.errors only."""

from decodegap.trace.load import load_trace, load_traces
from decodegap.trace.tables import Trace

__all__ = ["Trace", "load_trace", "load_traces"]
