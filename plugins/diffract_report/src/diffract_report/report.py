"""Readings of a session's results a person looks at: per-model summaries (the
WeightWatcher-style reading of alpha) and a one-file HTML report.

``summarize(session)`` is what ``diffract analyze`` prints under its table;
``write_html(session, path)`` is what ``--report`` writes. Both only read results: run
``compute.apply`` first. (The summaries live in :mod:`diffract_report.summary`, the
HTML in ``diffract_report._html``; this module is their public face.)
"""

from diffract_report._html import figure_html, html_table, write_html
from diffract_report.summary import (
    ALPHA_OVER_TRAINED,
    ALPHA_UNDER_TRAINED,
    conventions_line,
    format_table,
    format_value,
    pair_matrix,
    summarize,
    summary_lines,
)

__all__ = ["ALPHA_OVER_TRAINED", "ALPHA_UNDER_TRAINED", "conventions_line", "figure_html",
           "format_table", "format_value", "html_table", "pair_matrix", "summarize",
           "summary_lines", "write_html"]
