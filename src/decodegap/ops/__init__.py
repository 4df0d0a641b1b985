"""What a GPU kernel or a CPU op is, by its name and shapes: its category (`categories`), its short name for tables
(`kernel_names`), the bytes it moves (`shapes`). Read by every stage from steps/ on.

May import: nothing of decodegap (the helpers below every stage)."""
