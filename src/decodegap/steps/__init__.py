"""The steps of a trace and the layers inside them, the stage after trace/: step annotations parsed (`marks`),
once-per-forward work in time (`anchors`), the repeating kernel sequence as the fallback (`repetition`), layers
from the work every layer does alike (`layers`), training or inference, decode or prefill (`phase`), and the
`Steps` they give (`steps.find_steps`).

May import: trace/, ops/ and the helpers (errors, records, rounding)."""
