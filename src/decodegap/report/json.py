"""The JSON report (schema decodegap.report/1): the Analysis, encoded. Names are stable: other tools read them."""

from __future__ import annotations

from decodegap.analysis import Analysis, build
from decodegap.pipeline import Report


def report_dict(report: Report) -> dict:
    """The report of a pipeline run as plain JSON data (what `--format json` prints)."""
    return build(report).to_dict()


def render_json(report: Report | Analysis) -> str:
    analysis = report if isinstance(report, Analysis) else build(report)
    return analysis.to_json()
