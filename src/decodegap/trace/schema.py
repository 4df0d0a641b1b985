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
    # In the order Kineto writes them (its ops: External id, ..., Input type, ..., Input Dims; its kernels: External
    # id, ..., device, ..., stream, correlation, ..., grid, block): msgspec looks each key up from the field after the
    # last one it found, so a key in order is found at the first try, and an unknown key costs a look at every field.
    external_id: int = msgspec.field(default=-1, name="External id")
    # Kept as raw JSON text: used as grouping keys, parsed only for the few distinct values.
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    device: int = -1
    stream: int = -1
    correlation: int = -1
    grid: msgspec.Raw = msgspec.Raw()
    block: msgspec.Raw = msgspec.Raw()
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
