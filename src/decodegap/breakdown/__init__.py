"""Where the time of the main phase's steps goes, the stage after steps/: per category and kernel group, GPU busy
and idle time, launch cost, the layer count (`breakdown.compute_breakdown` -> `Breakdown`), and the rows of each
step and of each layer of the typical step (`rows`: `StepRow`, `LayerRow`).

May import: steps/, trace/, ops/ and the helpers."""
