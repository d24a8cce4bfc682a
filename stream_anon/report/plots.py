"""The report's figures: matplotlib ``Figure`` objects rendered to PNG bytes (Agg, no pyplot state).

Each ``plot_*`` function takes the loaded data and returns PNG bytes; none of them reads files.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from stream_anon.report.analysis import AttributeGeneralization
from stream_anon.report.rundir import TV_METRIC, LdpCurve, SideEstimate

if TYPE_CHECKING:  # matplotlib (~0.7 s to import) is imported when a figure is drawn, not with the module
    from matplotlib.figure import Figure

DPI = 100
BOUND_STYLE: dict[str, Any] = {"color": "#d62728", "linestyle": "--", "linewidth": 2}
LOSS_COLUMNS = (("gt_loss", "GT loss"), ("lm_loss", "LM loss (sum over the QIs)"), ("ubdsa_loss", "UBDSA loss"))
# bands of relative generalization for the stacked bars (0 = exact value, 1 = whole domain)
GENERALIZATION_BANDS = ((0.0, 0.0, "exact"), (0.0, 0.1, "<= 10%"), (0.1, 0.25, "10-25%"), (0.25, 0.5, "25-50%"),
                        (0.5, 1.0, "50-<100%"), (1.0, 1.0, "whole domain"))


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="tight")
    FigureCanvasAgg(fig)
    return fig


def _log_x_at(ax: Any, values: Sequence[float]) -> None:
    """Log x axis with plain tick labels at the data's own values (no 2 x 10^0 style labels)."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
    ax.xaxis.set_minor_locator(NullLocator())
    fmt = ScalarFormatter()
    fmt.set_scientific(False)
    ax.xaxis.set_major_formatter(fmt)


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def plot_loss_grid(grid: pd.DataFrame, own: tuple[float | None, float | None] = (None, None)) -> bytes:
    """Information loss vs k (one line per delta) and vs delta (one line per k), one row per loss measure, each
    from its own column.

    Grid points that differ only in other parameters (beta, mu) are averaged; the clustering loss the
    engine optimized (``loss_metric``) is the line style.  ``own``: the run's (k, delta), circled when the grid
    holds it.
    """
    measures = [(c, label) for c, label in LOSS_COLUMNS if c in grid and grid[c].notna().any()]
    metrics = sorted(grid["loss_metric"].unique())
    styles = ["-", "--", ":", "-."]
    fig = _new_figure(11, 3.4 * len(measures))
    axes = fig.subplots(len(measures), 2, squeeze=False)
    for row, (col, label) in enumerate(measures):
        for ax, (x, series) in zip(axes[row], (("k", "delta"), ("delta", "k")), strict=True):
            values = sorted(grid[series].unique())
            for mi, metric in enumerate(metrics):
                sub = grid[grid["loss_metric"] == metric]
                for si, v in enumerate(values):
                    pts = sub[sub[series] == v].groupby(x)[col].mean().dropna()
                    if pts.empty:
                        continue
                    ax.plot(pts.index, pts.to_numpy(), marker="o", linestyle=styles[mi % len(styles)],
                            color=f"C{si % 10}",
                            label=f"{series}={v:g}" + (f" ({metric})" if len(metrics) > 1 else ""))
                    own_x, own_series = (own[0], own[1]) if x == "k" else (own[1], own[0])
                    if own_series is not None and v == own_series and own_x in pts.index:
                        ax.plot([own_x], [pts.loc[own_x]], marker="o", markersize=14, markerfacecolor="none",
                                markeredgecolor="black", linestyle="none",
                                label="this run" if mi == 0 else None)
            ax.set_xlabel(x)
            ax.set_ylabel(label)
            ax.set_title(f"{label} vs {x}")
            ax.set_ylim(bottom=0)
            if grid[x].nunique() > 2 and grid[x].min() > 0 and grid[x].max() / grid[x].min() >= 10:
                _log_x_at(ax, grid[x].unique().tolist())
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small", ncol=2)
    return figure_png(fig)


def plot_delays(arrivals: np.ndarray | None, seconds: np.ndarray | None, bound: float | None,
                population: str = "released records") -> bytes:
    """Distribution of release delays in arrivals against the bound delta (and in seconds when known)."""
    panels: list[tuple[np.ndarray, str]] = [(a, unit) for a, unit in ((arrivals, "arrivals"), (seconds, "seconds"))
                                            if a is not None and np.isfinite(a).any()]
    fig = _new_figure(5.5 * len(panels), 3.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (values, unit) in zip(axes, panels, strict=True):
        v = values[np.isfinite(values)]
        hi = max(float(v.max()), bound or 0.0) if unit == "arrivals" else float(v.max())
        bins = np.linspace(0, hi if hi > 0 else 1.0, 51).tolist()
        ax.hist(v, bins=bins, color="C0", alpha=0.85)
        for q, style in ((0.5, ":"), (0.99, "-.")):
            qv = float(np.quantile(v, q))
            ax.axvline(qv, color="black", linestyle=style, linewidth=1, label=f"p{round(q * 100)} = {qv:,.4g}")
        if unit == "arrivals" and bound is not None:
            ax.axvline(bound, label=f"bound delta = {bound:,.0f}", **BOUND_STYLE)
        ax.set_xlabel(f"release delay ({unit})")
        ax.set_ylabel("records")
        ax.set_title(f"Release delay in {unit}, {population} (n = {v.size:,}, max = {v.max():,.4g})",
                     fontsize="medium")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    return figure_png(fig)


def plot_class_sizes(sizes: np.ndarray, k: int | None) -> bytes:
    """Histogram of records per released class, with the anonymity parameter k."""
    fig = _new_figure(7, 3.6)
    ax = fig.subplots()
    top = int(sizes.max())
    if top <= 80:
        bins = np.arange(0.5, top + 1.5, 1.0).tolist()
    else:
        bins = (np.unique(np.geomspace(1, top + 1, 60).round()) - 0.5).tolist()
        ax.set_xscale("log")
    ax.hist(sizes, bins=bins, color="C2", alpha=0.85)
    if top <= 80:
        ax.set_xlim(left=max(0.0, min(int(sizes.min()), k or int(sizes.min())) - 1.5))
    if k is not None:
        ax.axvline(k, label=f"k = {k}", **BOUND_STYLE)
        below = int((sizes < k).sum())
        ax.text(0.98, 0.95, f"classes smaller than k: {below}", transform=ax.transAxes, ha="right", va="top")
    ax.set_xlabel("records per released class")
    ax.set_ylabel("classes")
    ax.set_title(f"Class sizes ({sizes.size:,} classes, median {np.median(sizes):g}, max {top})")
    ax.legend(fontsize="small", loc="upper center")
    ax.grid(alpha=0.3)
    return figure_png(fig)


def _band_shares(rel: np.ndarray) -> list[float]:
    """Share of the interpretable values in each band: exact, (0, .1], (.1, .25], (.25, .5], (.5, 1), whole."""
    r = rel[~np.isnan(rel)]
    n = max(r.size, 1)
    shares = []
    for lo, hi, _ in GENERALIZATION_BANDS:
        if lo == hi:
            inside = r == lo
        elif hi == 1.0:
            inside = (r > lo) & (r < 1.0)
        else:
            inside = (r > lo) & (r <= hi)
        shares.append(float(inside.sum()) / n)
    return shares


def plot_generalization(attrs: Sequence[AttributeGeneralization]) -> bytes:
    """Per QI: mean relative generalization (left) and the share of records per generalization band (right).

    For categorical QIs the mean hierarchy level (0 = leaf, height = root) is written next to the bar.
    """
    names = [a.name for a in attrs]
    y = np.arange(len(attrs))
    fig = _new_figure(12, 0.42 * len(attrs) + 1.6)
    ax1, ax2 = fig.subplots(1, 2)
    means = [a.mean_relative for a in attrs]
    colors = ["C0" if a.kind == "numeric" else "C1" for a in attrs]
    ax1.barh(y, means, color=colors)
    for yi, a in zip(y, attrs, strict=True):
        text = f"{a.mean_relative:.2f}"
        if a.levels is not None and a.height is not None:
            lv = a.levels[a.levels >= 0]
            text += f"  (level {lv.mean():.1f}/{a.height})" if lv.size else ""
        ax1.text(min(a.mean_relative, 1.0) + 0.01, yi, text, va="center", fontsize="small")
    ax1.set_yticks(y, names)
    ax1.invert_yaxis()
    ax1.set_xlim(0, 1.25)
    ax1.set_xlabel("mean relative generalization (0 = exact, 1 = whole domain)")
    ax1.set_title("Generalization per attribute (blue numeric: width / domain; orange: (leaves - 1)/(M - 1))",
                  fontsize="medium")
    ax1.grid(axis="x", alpha=0.3)
    shares = np.array([_band_shares(a.relative) for a in attrs])
    left = np.zeros(len(attrs))
    cmap_colors = ["#2ca02c", "#98df8a", "#ffdd71", "#ff9f40", "#e8684a", "#7f7f7f"]
    for j, (_, _, label) in enumerate(GENERALIZATION_BANDS):
        ax2.barh(y, shares[:, j], left=left, color=cmap_colors[j], label=label)
        left += shares[:, j]
    ax2.set_yticks(y, names)
    ax2.invert_yaxis()
    ax2.set_xlim(0, 1)
    ax2.set_xlabel("share of released records")
    ax2.set_title("Records by generalization band", fontsize="medium")
    ax2.legend(fontsize="small", ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.06))
    return figure_png(fig)


@dataclass(frozen=True)
class LdpSeries:
    """One line of the epsilon-vs-error plot and its band, exactly as drawn."""

    metric: str
    label: str
    epsilon: np.ndarray
    error: np.ndarray
    lower: np.ndarray | None  # band: error - std, clipped to the metric's range
    upper: np.ndarray | None  # band: error + std, clipped to the metric's range


def ldp_series(curves: Sequence[LdpCurve]) -> list[LdpSeries]:
    """The lines :func:`plot_ldp_curves` draws: the valid curves (a total variation distance outside [0, 1]
    is not one: such curves are left out, see ``LdpCurve.valid``), bands clipped to the metric's range
    ([0, 1] for a total variation distance, >= 0 otherwise)."""
    out = []
    for c in curves:
        if not c.valid:
            continue
        top = 1.0 if c.is_total_variation else np.inf
        lower = upper = None
        if c.error_std is not None:
            lower = np.clip(c.error - c.error_std, 0.0, top)
            upper = np.clip(c.error + c.error_std, 0.0, top)
        out.append(LdpSeries(metric=c.error_metric, label=c.mechanism + (f" ({c.attribute})" if c.attribute else ""),
                             epsilon=c.epsilon, error=c.error, lower=lower, upper=upper))
    return out


def plot_ldp_curves(curves: Sequence[LdpCurve]) -> bytes:
    """Error vs epsilon of each LDP mechanism (:func:`ldp_series`); one panel per error measure, log-log axes.

    The band is plus/minus one standard deviation over repetitions, clipped to the measure's range; where it
    reaches zero it is drawn down to the bottom of the (log) axis.
    """
    series = ldp_series(curves)
    if not series:
        raise ValueError("no curve to plot (every total variation distance was outside [0, 1])")
    metrics = list(dict.fromkeys(s.metric for s in series))
    fig = _new_figure(5.5 * len(metrics), 4.0)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        group = [s for s in series if s.metric == metric]
        positive = np.concatenate([s.error[s.error > 0] for s in group])
        log_y = positive.size > 0 and all((s.error > 0).all() for s in group)
        floor = float(positive.min()) / 3 if positive.size else 0.0
        for i, s in enumerate(group):
            ax.plot(s.epsilon, s.error, marker="o", color=f"C{i % 10}", label=s.label)
            if s.lower is not None and s.upper is not None:
                lower = np.maximum(s.lower, floor) if log_y else s.lower
                ax.fill_between(s.epsilon, lower, s.upper, color=f"C{i % 10}", alpha=0.2)
        _log_x_at(ax, np.concatenate([s.epsilon for s in group]).tolist())
        if log_y:
            ax.set_yscale("log")
            ax.set_ylim(bottom=floor)
        if metric == TV_METRIC:
            ax.set_ylim(top=1.0)
        ax.set_xlabel("epsilon")
        ax.set_ylabel(metric + (" (projected estimate)" if metric == TV_METRIC else ""))
        ax.set_title(f"{metric} vs epsilon")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="small")
    return figure_png(fig)


def plot_side_estimates(estimates: Sequence[SideEstimate], max_categories: int = 15) -> bytes:
    """Estimated vs true distribution of each side-topic attribute (bars with 95% intervals)."""
    n = len(estimates)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig = _new_figure(6.5 * cols, 3.8 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax, e in zip(axes, estimates, strict=False):
        order = np.arange(len(e.categories))
        if e.kind == "frequency" and len(order) > max_categories:
            key = e.true if e.true is not None else e.estimated
            order = np.argsort(-key)[:max_categories]
        x = np.arange(len(order))
        width = 0.4 if e.true is not None else 0.8
        err = 1.96 * e.std_errors[order] if e.std_errors is not None and len(e.std_errors) == len(e.estimated) \
            else None
        if e.true is not None:
            ax.bar(x - width / 2, e.true[order], width, color="C7", label="true")
        ax.bar(x + (width / 2 if e.true is not None else 0), e.estimated[order], width, yerr=err, capsize=2,
               color="C0", label="estimated" + (" (95% interval)" if err is not None else ""))
        ax.set_xticks(x, [e.categories[i] for i in order], rotation=45, ha="right", fontsize="small")
        shown = "" if len(order) == len(e.categories) else f" (top {len(order)} of {len(e.categories)})"
        ax.set_title(f"{e.topic}: {e.attribute}{shown}", fontsize="medium")
        ax.set_ylabel("frequency" if e.kind == "frequency" else "mean")
        ax.legend(fontsize="small")
        ax.grid(axis="y", alpha=0.3)
    for ax in axes[n:]:
        ax.set_visible(False)
    return figure_png(fig)
