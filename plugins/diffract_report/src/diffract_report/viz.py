"""Plots of stored results (matplotlib, drawn off-screen: no display needed).

``plot_esd(session, model_id, param)`` draws one layer's empirical spectral density: on
log-log axes with the fitted power law and its ``xmin``, and as a linear histogram with
the Marchenko-Pastur density of a random matrix of the same shape and scale.
``plot_depth(session, model_id)`` draws metrics against depth (the parameters' order in
the model). ``plot_model`` writes both as PNG files. Each reads stored fields only:
apply ``esd`` (and ``pl_alpha``, ``mp_bulk_max``...) first. matplotlib is imported when
a plot is drawn (``pip install matplotlib``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import DiffractError, InvalidArgumentError

__all__ = ["depth_fields", "depth_figure", "esd_figure", "esd_figures", "esd_rows",
           "heatmap_figure", "plot_depth", "plot_esd", "plot_model", "save_png", "short_names"]

#: Fields drawn against depth when present.
DEPTH_FIELDS = ("pl_alpha", "stable_rank")
#: Fields an ESD plot draws: the spectrum, the fitted power law, the random bulk's edge.
ESD_FIELDS = ("esd", "pl_alpha", "pl_xmin", "mp_bulk_max")


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise DiffractError("Plots need matplotlib: pip install matplotlib.") from None
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)  # off-screen: never touches pyplot's global backend
    return fig


def _params(session: Any, model_id: str) -> list[Any]:
    """ParamInfo records of a model, from a session or a view of one."""
    return getattr(session, "session", session).models.params(model_id)


def esd_rows(session: Any, model_id: str) -> dict[str, dict[str, Any]]:
    """What the ESD plots draw, read once for a whole model: per parameter with an
    ``esd`` stored, its ESD and whichever of ``ESD_FIELDS`` are stored."""
    known = set(session.compute.list_available_metrics())
    if "esd" not in known:
        return {}
    fields = [f for f in ESD_FIELDS if f in known]
    rows = session.results.export_metrics(*fields)[model_id]
    return {param: row for param, row in rows.items() if "esd" in row}


def mp_density(x: np.ndarray, total: float, n: int, m: int) -> np.ndarray:
    """Marchenko-Pastur density of the eigenvalues of ``W^T W`` for an ``n x m`` matrix
    of i.i.d. entries whose squares sum to ``total`` (the ESD's sum): with ``k =
    min(n, m)``, ``L = max(n, m)``, ``q = k / L``, ``s^2 = total / (k L)`` and
    ``lambda_+- = L s^2 (1 +- sqrt(q))^2``, ``rho(lambda) = sqrt((lambda_+ - lambda)
    (lambda - lambda_-)) / (2 pi q L s^2 lambda)`` inside the bulk, 0 outside."""
    k, big = min(n, m), max(n, m)
    q = k / big
    scale = total / k  # = L s^2
    lo, hi = scale * (1 - math.sqrt(q)) ** 2, scale * (1 + math.sqrt(q)) ** 2
    x = np.asarray(x, dtype=np.float64)
    inside = (x > lo) & (x < hi)
    out = np.zeros_like(x)
    xi = x[inside]
    out[inside] = np.sqrt((hi - xi) * (xi - lo)) / (2 * math.pi * q * scale * xi)
    return out


def linear_range(esd: np.ndarray, edge: Any = None) -> tuple[float, int]:
    """Where the linear ESD panel ends, and how many eigenvalues lie beyond: all of them
    are shown unless a few outliers would squeeze the bulk into the first bin (the
    largest over 4x the 99th percentile); then the panel ends at the bulk (that
    percentile, or 1.2x the Marchenko-Pastur edge where that is larger) and says how many
    lie beyond it, up to which value."""
    hi, q = float(esd.max()), float(np.quantile(esd, 0.99))
    if hi <= 4 * q:
        return hi, 0
    top = max(q, 1.2 * edge if edge is not None and math.isfinite(edge) and edge < hi else q)
    return top, int(np.count_nonzero(esd > top))


def mp_curve(x: np.ndarray, esd: np.ndarray, shape: Sequence[int],
             histogram_top: float) -> tuple[np.ndarray, str, float | None]:
    """The Marchenko-Pastur density over ``x`` for the linear panel, its label, and the
    height it is clipped at: the panel's y axis follows the histogram (a square matrix's
    density diverges at 0 and would leave the histogram a flat line at the bottom), so a
    curve above 1.25x the histogram's top is cut there and its label says how high it
    goes."""
    n, m = int(shape[0]), int(np.prod(shape[1:]))
    y = mp_density(x, float(esd.sum()), n, m) * (min(n, m) / esd.size)
    cap = 1.25 * histogram_top
    peak = float(np.max(y)) if y.size else 0.0
    if histogram_top > 0 and peak > cap:
        return (np.minimum(y, cap), f"Marchenko-Pastur (clipped; it reaches {peak:.3g})",
                cap)
    return y, "Marchenko-Pastur", None


def linear_title(esd: np.ndarray, top: float, beyond: int) -> str:
    return ("linear ESD" if not beyond else f"linear ESD, the bulk: {beyond} eigenvalue(s) "
            f"beyond {top:.3g}, up to {float(esd.max()):.3g}")


def esd_figure(session: Any, model_id: str, param: str) -> Any:
    """The figure ``plot_esd`` saves (a matplotlib Figure)."""
    row = esd_rows(session.filter(param_ids=[f"{model_id}/{param}"]), model_id).get(param)
    if row is None:
        raise InvalidArgumentError(
            f"{model_id}/{param} has no ESD stored: apply it first "
            "(session.compute.apply('esd', 'pl_alpha'))."
        )
    shape = next((p.shape for p in _params(session, model_id) if p.name == param), None)
    return _draw_esd(model_id, param, row, shape)


def _draw_esd(model_id: str, param: str, fits: dict[str, Any], shape: Any) -> Any:
    esd = np.asarray(fits["esd"], dtype=np.float64)
    esd = esd[esd > 0]
    if esd.size == 0:
        raise InvalidArgumentError(f"{model_id}/{param}: the ESD has no positive eigenvalue "
                                   "to plot.")
    fig = _figure(10, 4)
    log_ax, lin_ax = fig.subplots(1, 2)
    # log-log: density on log-spaced bins, the fitted law over its tail
    lo, hi = esd.min(), esd.max()
    bins = np.geomspace(lo, hi * (1 + 1e-9), max(10, min(60, esd.size // 4)))
    counts, edges = np.histogram(esd, bins=bins)
    density = counts / (esd.size * np.diff(edges))
    centres = np.sqrt(edges[:-1] * edges[1:])
    keep = counts > 0
    log_ax.loglog(centres[keep], density[keep], "o", ms=4, color="tab:blue", label="ESD")
    alpha, xmin = fits.get("pl_alpha"), fits.get("pl_xmin")
    if alpha is not None and xmin is not None and math.isfinite(alpha) and math.isfinite(xmin):
        share = float(np.mean(esd >= xmin))
        x = np.geomspace(xmin, hi, 50)
        log_ax.loglog(x, share * (alpha - 1) / xmin * (x / xmin) ** -alpha, "-",
                      color="tab:red", label=f"power law, alpha={alpha:.2f}")
        log_ax.axvline(xmin, color="tab:red", ls="--", lw=1, label=f"xmin={xmin:.3g}")
    log_ax.set_xlabel("eigenvalue of W^T W")
    log_ax.set_ylabel("density")
    log_ax.set_title("log-log ESD", y=1.0)  # a set y skips the title's collision search
    from matplotlib.ticker import FuncFormatter, NullLocator

    for axis in (log_ax.xaxis, log_ax.yaxis):  # minor ticks and mathtext labels (10^k) cost
        axis.set_minor_locator(NullLocator())  # more than the rest of the figure
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    log_ax.legend(fontsize=8)
    # linear: histogram and the Marchenko-Pastur bulk of a random matrix like it
    top, beyond = linear_range(esd, fits.get("mp_bulk_max"))
    counts, edges = np.histogram(esd[esd <= top], bins=max(10, min(80, esd.size // 3)))
    density = counts / (esd.size * np.diff(edges))
    lin_ax.stairs(density, edges, fill=True, color="tab:blue",
                  alpha=0.6, label="ESD")  # one artist, not a patch per bin
    if shape is not None and len(shape) >= 2:
        x = np.linspace(lo, top, 400)
        y, label, cap = mp_curve(x, esd, shape, float(density.max()))
        lin_ax.plot(x, y, color="tab:orange", label=label)
        if cap is not None:
            lin_ax.set_ylim(0, cap * 1.05)
        edge = fits.get("mp_bulk_max")
        if edge is not None and math.isfinite(edge) and edge <= top:
            lin_ax.axvline(edge, color="tab:orange", ls="--", lw=1, label="bulk edge")
    lin_ax.set_xlabel("eigenvalue of W^T W")
    lin_ax.set_title(linear_title(esd, top, beyond), y=1.0, fontsize=9 if beyond else None)
    lin_ax.legend(fontsize=8)
    fig.suptitle(f"{model_id} / {param}", fontsize=10)
    # fixed margins: tight_layout drew every figure twice more to measure its labels
    fig.subplots_adjust(left=0.1, right=0.985, bottom=0.13, top=0.87, wspace=0.22)
    return fig


def depth_figure(session: Any, model_id: str,
                 fields: Sequence[str] = DEPTH_FIELDS) -> Any:
    """The figure ``plot_depth`` saves: one panel per field, value against the position
    of the parameter in the model (matrices only)."""
    known = set(session.compute.list_available_metrics())
    fields = [f for f in fields if f in known]
    if not fields:
        raise InvalidArgumentError("None of the fields to plot against depth is installed.")
    rows = session.results.export_metrics(*fields)[model_id]
    order = [p.name for p in _params(session, model_id) if len(p.shape) >= 2]
    fig = _figure(10, 2.6 * len(fields))
    axes = fig.subplots(len(fields), 1, squeeze=False)[:, 0]
    for ax, field in zip(axes, fields, strict=True):
        xs = [i for i, name in enumerate(order) if field in rows.get(name, {})]
        ys = [float(rows[order[i]][field]) for i in xs]
        ax.plot(xs, ys, "o-", ms=3)
        ax.set_ylabel(field)
        if field == "pl_alpha":
            ax.axhspan(2, 6, color="tab:green", alpha=0.08, label="2 <= alpha <= 6")
            ax.legend(fontsize=8, loc="upper right")
    for ax in axes:
        ax.set_xticks(range(len(order)), labels=short_names(order) if ax is axes[-1] else [],
                      rotation=90, fontsize=7)
    axes[-1].set_xlabel("layer (model order, matrices only)")
    fig.suptitle(f"{model_id}: metrics against depth", fontsize=10)
    fig.tight_layout()
    return fig


def short_names(names: Sequence[str]) -> list[str]:
    """Layer names without their common prefix and a trailing ``.weight``; a prefix that
    ends at the layer index keeps its last word (``layer.3.mlp``, not ``3.mlp``)."""
    if not names:
        return []
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    prefix = prefix[: prefix.rfind(".") + 1] if "." in prefix else ""
    if prefix and all(re.match(r"\d+(\.|$)", n[len(prefix):]) for n in names):
        prefix = prefix[: prefix[:-1].rfind(".") + 1]
    return [re.sub(r"\.weight$", "", n[len(prefix):]) or n for n in names]


def heatmap_figure(matrix: Any, rows: Sequence[str], cols: Sequence[str], title: str) -> Any:
    """A heat map of ``matrix`` (rows x cols; NaN left blank) with its labels."""
    matrix = np.asarray(matrix, dtype=np.float64)
    fig = _figure(min(3 + 1.1 * len(cols), 14), min(2 + 0.22 * len(rows), 30))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto", cmap="viridis",
                      interpolation="nearest")
    ax.set_xticks(range(len(cols)), labels=list(cols), rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), labels=list(rows), fontsize=7)
    bar = fig.colorbar(image, ax=ax, label=title)
    bar.formatter.set_useOffset(False)  # 0.99999x as such, not "1e-6+9.99999e-1" on top
    bar.update_ticks()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.set_layout_engine(None)
    _inside(fig)
    return fig


def _inside(fig: Any) -> None:
    """Widen ``fig`` until every text it draws (the colour bar's label on the right, long
    row names on the left) lies inside it: tight_layout keeps the axes' labels in, not a
    colour bar's."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for _ in range(3):
        boxes = [t.get_window_extent(renderer) for t in fig.findobj(
            lambda a: hasattr(a, "get_text") and a.get_visible() and a.get_text())]
        width = fig.bbox.width
        left = min((b.x0 for b in boxes), default=0.0)
        right = max((b.x1 for b in boxes), default=width)
        if left >= 0 and right <= width:
            return
        extra = max(0.0, -left) + max(0.0, right - width) + 4
        inches = fig.get_size_inches()
        shift = (max(0.0, -left) + 2) / (width + extra)
        for ax in fig.axes:  # keep each axes' place in pixels, moved right by the overflow
            box = ax.get_position()
            ax.set_position([box.x0 * width / (width + extra) + shift,
                             box.y0, box.width * width / (width + extra), box.height])
        fig.set_size_inches(inches[0] * (width + extra) / width, inches[1])
        fig.canvas.draw()


def save_png(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG (folders made as needed); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", pil_kwargs={"compress_level": 1})
    return path


def _save(fig: Any, path: str | Path | None) -> Any:
    return fig if path is None else save_png(fig, path)


def plot_esd(session: Any, model_id: str, param: str, path: str | Path | None = None) -> Any:
    """One layer's ESD (log-log with the fitted power law and xmin; linear with the
    Marchenko-Pastur bulk). Saved as PNG at ``path``, else the Figure is returned."""
    return _save(esd_figure(session, model_id, param), path)


def plot_depth(session: Any, model_id: str, path: str | Path | None = None,
               fields: Sequence[str] = DEPTH_FIELDS) -> Any:
    """``fields`` against depth. Saved as PNG at ``path``, else the Figure is returned."""
    return _save(depth_figure(session, model_id, fields), path)


def _file_name(param: str) -> str:
    return re.sub(r"[^\w.\-]+", "_", param)


def esd_figures(session: Any, model_id: str) -> Iterator[tuple[str, Any]]:
    """(parameter, figure) for every parameter with a positive ESD stored, reading the
    model's ESD fields once."""
    rows = esd_rows(session, model_id)
    shapes = {p.name: p.shape for p in _params(session, model_id)}
    for param, row in rows.items():
        esd = np.asarray(row["esd"])
        if esd.ndim == 1 and np.any(esd > 0):
            yield param, _draw_esd(model_id, param, row, shapes.get(param))


def plot_model(session: Any, model_id: str, directory: str | Path,
               progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Every layer's ESD (where ``esd`` is stored) and the depth plot, as PNGs under
    ``directory/model_id/``; returns the paths written. ``progress(done, total)`` is
    called after each ESD plot. Computes nothing: what is not stored is not drawn."""
    folder = Path(directory) / _file_name(model_id)
    total = len(esd_rows(session, model_id))
    written = []
    for param, fig in esd_figures(session, model_id):
        written.append(save_png(fig, folder / f"esd_{_file_name(param)}.png"))
        if progress is not None:
            progress(len(written), total)
    depth = depth_fields(session, model_id)
    if depth:
        written.append(plot_depth(session, model_id, folder / "depth.png", depth))
    return written


def depth_fields(session: Any, model_id: str) -> list[str]:
    """Those of ``DEPTH_FIELDS`` that have values stored for ``model_id``."""
    known = [f for f in DEPTH_FIELDS if f in set(session.compute.list_available_metrics())]
    rows = session.results.export_metrics(*known)[model_id].values() if known else ()
    present = {f for r in rows for f in r}
    return [f for f in known if f in present]
