"""Diffract's command-line analysis, report and plots.

``diffract analyze``, ``compare`` and ``demo`` (:mod:`diffract_report.analyze`,
:mod:`~diffract_report.compare`, :mod:`~diffract_report.demo`) arrive in the
``diffract`` command through the core's ``diffract_commands`` hook;
:mod:`diffract_report.report` (``summarize``, ``write_html``) and
:mod:`diffract_report.viz` (``plot_esd``, ``plot_model``) are their public API.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
