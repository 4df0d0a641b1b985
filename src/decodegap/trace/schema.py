"""The subset of the Kineto trace format decodegap reads, as msgspec records.

Only the fields the analysis uses are declared; msgspec skips everything else while decoding, which is
what keeps loading fast and small. Unions and `strict=False` absorb the type drift seen across Kineto
versions (numbers as strings, string pids, missing args)."""

from __future__ import annotations

from typing import Union

import msgspec

IntLike = Union[int, str, None]

# gc=False: these records hold no reference cycles, and keeping 300k of them out of the garbage collector's
# tracking roughly halves decoding time.


class EventArgs(msgspec.Struct, kw_only=True, gc=False, frozen=True):
    # Plain ints with strict=False accept numbers written as strings; anything stranger (null, objects)
    # sends the file down the tolerant slow path in load.py.
    external_id: int = msgspec.field(default=-1, name="External id")
    correlation: int = -1
    device: int = -1
    stream: int = -1
    # Kept as raw JSON text: used as grouping keys, parsed only for the few distinct values.
    grid: msgspec.Raw = msgspec.Raw()
    block: msgspec.Raw = msgspec.Raw()
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    nbytes: int = msgspec.field(default=-1, name="bytes")
    # Collective metadata that torch records on the communication op (record_param_comms / nccl:*).
    collective_name: Union[str, None] = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: IntLike = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: IntLike = msgspec.field(default=None, name="Out msg nelems")
    msg_dtype: Union[str, None] = msgspec.field(default=None, name="dtype")
    group_size: IntLike = msgspec.field(default=None, name="Group size")


NO_ARGS = EventArgs()


class Event(msgspec.Struct, kw_only=True, gc=False):
    ph: str = ""
    cat: str = ""
    name: Union[str, int, float, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: float = float("nan")
    dur: float = 0.0
    args: Union[EventArgs, list, str, float, bool, None] = NO_ARGS


# Anything that is not an object in traceEvents is tolerated and dropped.
AnyEvent = Union[Event, list, str, float, bool, None]


class TraceDocument(msgspec.Struct, kw_only=True):
    traceEvents: Union[list[AnyEvent], None] = None
    deviceProperties: Union[list, None] = None
    distributedInfo: Union[dict, None] = None
    baseTimeNanoseconds: Union[int, float, None] = None
    decodegap_record: Union[dict, None] = None


# Old exporters wrote a bare JSON array of events.
Document = Union[TraceDocument, list[AnyEvent]]
