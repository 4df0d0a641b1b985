"""How reports round numbers: a fixed number of decimals, and None (JSON null) for what is missing or not finite."""

from __future__ import annotations

import math


def rounded(value, digits: int = 4) -> float | None:
    if value is None:
        return None
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None
