"""``write_report(run_dir) -> Path``: a self-contained HTML page (PNG plots as base64 data URIs) for a run.

Layout: a SYNTHETIC banner when the run's data is synthetic (``"synthetic": true`` in summary.json), a short
summary of key figures, then the plots: information loss vs k and delta (``grid.json``), release delay vs the
bound, class sizes, generalization per attribute, epsilon vs error of the LDP mechanisms (``ldp_curves.json``),
estimated vs true distributions on the side topics (``side_estimates.json``); the raw summary.json last, in a
collapsed ``<details>``.  Every section shown is filled: a section whose input is missing is left out, and the
summary names it and how to produce it (:data:`NOT_SHOWN_HOW`); a missing input never fails the report.  The
run-directory format: docs/deploy.md.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stream_anon.core.validation import is_number
from stream_anon.report import plots
from stream_anon.report.analysis import class_sizes, generalization_levels, quantiles
from stream_anon.report.rundir import (
    DELAYS_FILE,
    GRID_FILE,
    LDP_CURVES_FILE,
    RELEASED_FILE,
    SIDE_ESTIMATES_FILE,
    SUMMARY_FILE,
    RunDir,
    RunDirError,
    load_run_dir,
    summary_value,
)

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2em auto; max-width: 1250px;
       color: #222; line-height: 1.45; padding: 0 1em; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { margin-top: 2em; border-bottom: 1px solid #eee; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 90%; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f6f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; }
.missing { background: #fff7e0; border-left: 4px solid #f0b400; padding: .5em 1em; }
.note { color: #666; font-size: 90%; }
code { background: #f3f3f3; padding: 0 .25em; }
.banner { background: #b00020; color: #fff; font-weight: bold; font-size: 115%; padding: .7em 1em; margin: 1em 0; }
details > summary { cursor: pointer; font-weight: bold; margin: .5em 0; }
"""
DELAY_POPULATION = "released records"


@dataclass
class Section:
    anchor: str
    title: str
    body: list[str] = field(default_factory=list)
    images: list[tuple[str, bytes]] = field(default_factory=list)  # (alt text, PNG)


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        v = int(v)  # an integer is printed as one (a k of 10, not 10.0)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return str(v)


def _flatten(d: Mapping[str, Any], prefix: str = "", depth: int = 0) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, v in d.items():
        name = f"{prefix}{key}"
        if isinstance(v, Mapping) and depth < 3:
            out.extend(_flatten(v, name + ".", depth + 1))
        elif isinstance(v, list) and len(v) > 12:
            out.append((name, f"[{len(v)} values]"))
        else:
            out.append((name, v))
    return out


def _table(rows: list[tuple[str, Any]], header: tuple[str, str] = ("", "")) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td class=\"{'num' if isinstance(v, int | float) else ''}\">"
        f"{html.escape(_fmt(v))}</td></tr>" for k, v in rows)
    head = f"<tr><th>{html.escape(header[0])}</th><th>{html.escape(header[1])}</th></tr>" if any(header) else ""
    return f"<table>{head}{cells}</table>"


def _missing(text: str) -> str:
    return f'<p class="missing">{text}</p>'


def _guard(section: Section, what: str, fn: Callable[[], None]) -> None:
    """Run one section's computation; a failure is reported in that section instead of failing the page."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (one bad input must not lose the rest of the report)
        log.exception("report section %r failed", section.title)
        section.body.append(_missing(f"Could not draw {html.escape(what)}: {html.escape(type(e).__name__)}: "
                                     f"{html.escape(str(e))}"))


def _nested(summary: Mapping[str, Any], *path: str) -> Any:
    node: Any = summary
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def key_figures(run: RunDir) -> list[tuple[str, Any]]:
    """The short summary at the top of the report: what a reader needs before the plots."""
    s = run.summary
    rows: list[tuple[str, Any]] = []
    source = summary_value(s, "data_source") or summary_value(s, "dataset")
    if source is not None:
        rows.append(("data", source))
    for key, label in (("records_in", "records in"), ("records_released", "records released"),
                       ("records_suppressed", "records suppressed"), ("records_dead_lettered", "records dead-lettered"),
                       ("records_unaccounted", "records unaccounted")):
        v = summary_value(s, key)
        if v is not None:
            rows.append((label, v))
    sizes = class_sizes(run.released)
    rows.append((f"released records / classes ({RELEASED_FILE})", f"{len(run.released):,} / {sizes.size:,}"))
    k, delta = run.k, run.delta
    rows.append(("k, delta (arrivals)", f"{k if k is not None else 'unknown'}, "
                                       f"{_fmt(delta) if delta is not None else 'unknown'}"))
    if sizes.size:
        rows.append(("smallest class", int(sizes.min())))
    verified = _nested(s, "k_anonymity", "verified")
    if isinstance(verified, bool):
        rows.append(("k-anonymity (independent checker)", "verified" if verified else "VIOLATED"))
    for key, label in (("gt_loss", "GT loss"), ("lm_loss_normalized", "LM loss per QI")):
        v = summary_value(s, key)
        if is_number(v):
            rows.append((label, v))
    if run.delays_arrivals is not None:
        q = quantiles(run.delays_arrivals)
        if q:
            rows.append((f"release delay p50 / p99 (arrivals, {DELAY_POPULATION})", f"{q['p50']:,.4g} / {q['p99']:,.4g}"))
    return rows


NOT_SHOWN_HOW: dict[str, str] = {
    "loss": f"<code>{GRID_FILE}</code> is missing: <code>stream-anon report RUN_DIR --compute-extras</code> runs "
            "the engine grid with the run's own settings",
    "delay": "there are no per-record delays (no <code>delay</code> column in <code>released.csv</code>, no "
             f"<code>{DELAYS_FILE}</code>)",
    "classes": "<code>released.csv</code> has no records",
    "generalization": "<code>released.csv</code> has no records or no quasi-identifier column of the schema",
    "ldp": f"<code>{LDP_CURVES_FILE}</code> is missing: <code>stream-anon report RUN_DIR --compute-extras</code> "
           "measures the run's side-path mechanisms",
    "side": f"<code>{SIDE_ESTIMATES_FILE}</code> is missing (the run had no side paths or did not save their "
            "estimates): <code>stream-anon report RUN_DIR --compute-extras</code> computes offline ones",
}
"""Why a section is not shown, and how to produce its input (said in the summary)."""
SECTION_TITLES = {"loss": "Information loss vs k and delta", "delay": "Release delay against the bound",
                  "classes": "Class sizes", "generalization": "Generalization per attribute",
                  "ldp": "Epsilon vs error of the LDP mechanisms",
                  "side": "Estimated vs true distributions on the side topics"}


def _summary_section(run: RunDir, not_shown: list[str] | None = None) -> Section:
    s = Section("summary", "Summary")
    s.body.append(f"<p>Run directory <code>{html.escape(str(run.path))}</code>. Key figures; the whole "
                  f'<code>{SUMMARY_FILE}</code> is under <a href="#raw">raw data</a> at the end.</p>')
    s.body.append(_table(key_figures(run)))
    if not_shown:
        items = "".join(f"<li>{html.escape(SECTION_TITLES[a])}: {NOT_SHOWN_HOW[a]}.</li>" for a in not_shown)
        s.body.append(f'<p class="note">Not shown, for want of their input:</p><ul class="note">{items}</ul>')
    return s


def _raw_section(run: RunDir) -> Section:
    s = Section("raw", "Raw data")
    rows = _flatten(run.summary)
    s.body.append(f"<details><summary><code>{SUMMARY_FILE}</code>, flattened ({len(rows)} entries)</summary>"
                  f"{_table(rows, (SUMMARY_FILE, 'value'))}</details>")
    if run.notes:
        s.body.append('<p class="note">' + html.escape("; ".join(run.notes)) + "</p>")
    return s


def _ints(values: Any) -> str:
    """``[5, 10]`` for grid values that are whole numbers (read as floats), not ``[5.0, 10.0]``."""
    return "[" + ", ".join(_fmt(v) for v in sorted(values)) + "]"


def _loss_section(run: RunDir) -> Section | None:
    if run.grid is None:
        return None
    s = Section("loss", SECTION_TITLES["loss"])

    def draw() -> None:
        assert run.grid is not None
        g = run.grid
        own = ""
        k, delta = run.k, run.delta
        if k is not None and delta is not None and ((g["k"] == k) & (g["delta"] == delta)).any():
            own = (f" The run's own point (k={_fmt(k)}, delta={_fmt(delta)}) is circled; the grid uses the run's "
                   "other settings (beta, mu, l, zeta, leftover) and its records, so the circle there is the run's "
                   "figure.")
        s.body.append(f"<p>{len(g)} grid points; k in {_ints(g['k'].unique().tolist())}, "
                      f"delta in {_ints(g['delta'].unique().tolist())}. Loss of the released data: "
                      "GT (Goldberger-Tassa, mean over the QIs, in [0, 1]), LM (Iyengar's loss metric, the sum over "
                      "the J QIs, in [0, J]: with these hierarchies each cell's LM loss equals its GT loss, so "
                      "LM = J x GT), UBDSA (CAIL); each from its own value; lower is better. Points that differ "
                      f"only in beta/mu are averaged.{own}</p>")
        s.images.append(("information loss vs k and delta", plots.plot_loss_grid(g, own=(k, delta))))
    _guard(s, "the loss grid", draw)
    return s


def _delay_section(run: RunDir) -> Section | None:
    if run.delays_arrivals is None and run.delays_seconds is None:
        return None
    s = Section("delay", SECTION_TITLES["delay"])

    def draw() -> None:
        bound = run.delta
        head = ("<tr><th>delay</th><th>records</th><th>n</th><th>p50</th><th>p90</th><th>p99</th><th>max</th>"
                "<th>mean</th></tr>")
        rows = []

        def row(measure: str, population: str, q: Mapping[str, Any], n: Any) -> None:
            cells = "".join(f'<td class="num">{html.escape(_fmt(q.get(key)) if q.get(key) is not None else "-")}'
                            "</td>" for key in ("p50", "p90", "p99", "max", "mean"))
            rows.append(f"<tr><th>{html.escape(measure)}</th><td>{html.escape(population)}</td>"
                        f'<td class="num">{html.escape(_fmt(n))}</td>{cells}</tr>')

        over = None
        if run.delays_arrivals is not None:
            finite = run.delays_arrivals[np.isfinite(run.delays_arrivals)]
            row("arrivals", DELAY_POPULATION, quantiles(run.delays_arrivals), int(finite.size))
            if bound is not None:
                over = int((finite > bound).sum())
        if run.delays_seconds is not None:
            finite = run.delays_seconds[np.isfinite(run.delays_seconds)]
            row("seconds", DELAY_POPULATION, quantiles(run.delays_seconds), int(finite.size))
        other = run.summary.get("delay_arrivals")
        if isinstance(other, Mapping) and other.get("p50") is not None:
            population = str(other.get("population") or "released + suppressed records (the demo's summary)")
            row(f"arrivals ({SUMMARY_FILE} delay_arrivals)", population, other, other.get("n", "-"))
        s.body.append(f"<table>{head}{''.join(rows)}</table>")
        facts: list[tuple[str, Any]] = [("bound delta (arrivals)", bound if bound is not None else "unknown")]
        if over is not None:
            facts.append(("released records over the bound delta", over))
        s.body.append(_table(facts))
        s.body.append(f'<p class="note">Delay of a record: arrivals on its partition between its own arrival and its '
                      f"release. This report's rows are over the {DELAY_POPULATION} of <code>{DELAYS_FILE}</code> / "
                      f"<code>{RELEASED_FILE}</code> (quantiles: linear interpolation, numpy's default). A "
                      f"<code>{SUMMARY_FILE}</code> row, when present, is the run's own figure over the population "
                      "named: suppressed records are not released, so they are not in this report's rows, and the "
                      "two p50 differ when the run suppressed records.</p>")
        s.images.append(("release delay distribution", plots.plot_delays(run.delays_arrivals, run.delays_seconds,
                                                                         bound, DELAY_POPULATION)))
    _guard(s, "the delay distribution", draw)
    return s


def _class_section(run: RunDir) -> Section | None:
    sizes = class_sizes(run.released)
    if sizes.size == 0:
        return None
    s = Section("classes", SECTION_TITLES["classes"])

    def draw() -> None:
        k = run.k
        rows: list[tuple[str, Any]] = [("classes", int(sizes.size)), ("k", k if k is not None else "unknown"),
                                       ("smallest class", int(sizes.min())), ("median class", float(np.median(sizes))),
                                       ("largest class", int(sizes.max()))]
        if k is not None:
            rows.append(("classes smaller than k", int((sizes < k).sum())))
        s.body.append(_table(rows))
        s.body.append('<p class="note">Records per <code>class_id</code> of <code>released.csv</code> (records, not '
                      "distinct individuals; ADULT has one record per individual).</p>")
        s.images.append(("class size histogram", plots.plot_class_sizes(sizes, k)))
    _guard(s, "the class sizes", draw)
    return s


def _generalization_section(run: RunDir) -> Section | None:
    attrs = generalization_levels(run.released, run.schema)
    if not attrs or len(run.released) == 0:
        return None
    s = Section("generalization", SECTION_TITLES["generalization"])

    def draw() -> None:
        rows = []
        for a in attrs:
            level = ""
            if a.levels is not None and a.height is not None and (a.levels >= 0).any():
                level = f"{a.levels[a.levels >= 0].mean():.2f} of {a.height}"
            rows.append(f"<tr><th>{html.escape(a.name)}</th><td>{a.kind}</td><td class=\"num\">{a.mean_relative:.3f}"
                        f"</td><td class=\"num\">{level}</td><td class=\"num\">{a.unparsed}</td></tr>")
        s.body.append("<table><tr><th>attribute</th><th>type</th><th>mean relative generalization</th>"
                      "<th>mean hierarchy level</th><th>uninterpretable values</th></tr>" + "".join(rows) + "</table>")
        s.body.append('<p class="note">Relative generalization: numeric <code>[a-b]</code> is (b - a)/(hi - lo) of '
                      "the public domain; categorical node n is (leaves(n) - 1)/(M - 1) of its hierarchy (the "
                      "per-attribute terms of the GT/LM loss). Level 0 is the original value, the hierarchy "
                      "height is <code>*</code>.</p>")
        s.images.append(("generalization per attribute", plots.plot_generalization(attrs)))
    _guard(s, "the generalization levels", draw)
    return s


def _ldp_section(run: RunDir) -> Section | None:
    if not run.ldp_curves:
        return None
    s = Section("ldp", SECTION_TITLES["ldp"])

    def draw() -> None:
        assert run.ldp_curves is not None
        names = ", ".join(sorted({c.mechanism for c in run.ldp_curves}))
        s.body.append(f"<p>Mechanisms: {html.escape(names)}. Shaded: plus/minus one standard deviation over "
                      "repetitions (clipped to the measure's range).</p>")
        if any(c.is_total_variation for c in run.ldp_curves):
            s.body.append('<p class="note">Total variation distance TV = 1/2 sum<sub>v</sub> |p&#770;(v) - f(v)| '
                          "between the true distribution f and the estimate <em>projected onto the probability "
                          "simplex</em> p&#770; (the closest distribution in Euclidean distance; Duchi et al. 2008). "
                          "The unbiased estimate itself has negative entries and is not a distribution, so a TV "
                          "computed on it is not bounded by 1. Every plotted TV is in [0, 1].</p>")
        dropped = [c for c in run.ldp_curves if not c.valid]
        if dropped:
            labels = ", ".join(f"{c.mechanism} ({c.attribute})" if c.attribute else c.mechanism for c in dropped)
            s.body.append(_missing(f"Not plotted: {html.escape(labels)}: a total variation distance outside [0, 1] "
                                   f"in <code>{LDP_CURVES_FILE}</code> (computed on an unprojected estimate by an "
                                   "older version); <code>stream-anon report RUN_DIR --compute-extras "
                                   "--overwrite-extras</code> recomputes it."))
        if len(dropped) < len(run.ldp_curves):
            s.images.append(("epsilon vs error", plots.plot_ldp_curves(run.ldp_curves)))
    _guard(s, "the LDP curves", draw)
    return s


def _side_section(run: RunDir) -> Section | None:
    if not run.side_estimates:
        return None
    s = Section("side", SECTION_TITLES["side"])

    def draw() -> None:
        assert run.side_estimates is not None
        rows = []
        for e in run.side_estimates:
            if e.true is not None:
                mae = float(np.abs(e.estimated - e.true).mean())
                rows.append((f"{e.topic} {e.attribute} ({e.kind})", mae))
        if rows:
            s.body.append(_table(rows, ("estimate", "mean absolute error")))
        s.images.append(("estimated vs true distributions", plots.plot_side_estimates(run.side_estimates)))
    _guard(s, "the side-topic estimates", draw)
    return s


SECTION_BUILDERS: tuple[tuple[str, Callable[[RunDir], Section | None]], ...] = (
    ("loss", _loss_section), ("delay", _delay_section), ("classes", _class_section),
    ("generalization", _generalization_section), ("ldp", _ldp_section), ("side", _side_section))
"""The plotted sections, in page order (between the summary and the raw data); a builder returns None when the
section's input is missing (the section is then not shown, and the summary says why)."""


def build_sections(run: RunDir) -> list[Section]:
    """The sections of the report, plots rendered: the summary, every plotted section whose input is there, the
    raw data."""
    shown: list[Section] = []
    not_shown: list[str] = []
    for anchor, build in SECTION_BUILDERS:
        section = build(run)
        if section is None:
            not_shown.append(anchor)
        else:
            shown.append(section)
    return [_summary_section(run, not_shown), *shown, _raw_section(run)]


def synthetic_banner(run: RunDir) -> str:
    """The banner at the top of a report on synthetic data ('' for real data)."""
    if not run.synthetic:
        return ""
    source = summary_value(run.summary, "data_source")
    what = f" ({html.escape(str(source))})" if source else ""
    return (f'<div class="banner" id="synthetic">SYNTHETIC DATA{what}: the records of this run are generated, '
            "not real; the figures describe the pipeline, not a population.</div>")


def render_html(run: RunDir, sections: list[Section] | None = None) -> str:
    """The page; ``sections`` from :func:`build_sections` (built here when not given): banner, summary, plots,
    raw data last."""
    sections = sections if sections is not None else build_sections(run)
    toc = "".join(f'<li><a href="#{s.anchor}">{html.escape(s.title)}</a></li>' for s in sections)
    tag = "[SYNTHETIC] " if run.synthetic else ""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{tag}stream-anon report: {html.escape(run.path.name)}</title>",
             f"<style>{CSS}</style></head><body>",
             f"<h1>{tag}stream-anon report: {html.escape(run.path.name)}</h1>", synthetic_banner(run),
             f'<p class="note">Generated {dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")} by '
             "<code>stream-anon report</code>.</p>"]
    for i, s in enumerate(sections):
        if i == 1:  # the contents after the short summary, before the plots
            parts.append(f"<ul>{toc}</ul>")
        parts.append(f'<h2 id="{s.anchor}">{html.escape(s.title)}</h2>')
        parts.extend(s.body)
        for alt, png in s.images:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>')
    parts.append("</body></html>")
    return "\n".join(parts)


def section_images(sections: list[Section]) -> dict[str, bytes]:
    """Every PNG of the report by name: the section anchor (``delay``), ``-2`` ... for further plots."""
    out: dict[str, bytes] = {}
    for s in sections:
        for i, (_, png) in enumerate(s.images):
            out[s.anchor if i == 0 else f"{s.anchor}-{i + 1}"] = png
    return out


OVERVIEW_SECTIONS = ("delay", "classes", "generalization", "ldp")


def overview_png(sections: list[Section], width: int = 1200) -> bytes | None:
    """One PNG stacking the delay, class-size, generalization and LDP plots (those present): wider plots are
    scaled down to ``width``, narrower ones centred."""
    from PIL import Image

    images = section_images(sections)
    tiles = []
    for name in OVERVIEW_SECTIONS:
        if name in images:
            img = Image.open(io.BytesIO(images[name])).convert("RGB")
            if img.width > width:
                img = img.resize((width, round(img.height * width / img.width)), Image.Resampling.LANCZOS)
            tiles.append(img)
    if not tiles:
        return None
    canvas = Image.new("RGB", (width, sum(t.height for t in tiles)), "white")
    y = 0
    for t in tiles:
        canvas.paste(t, ((width - t.width) // 2, y))
        y += t.height
    buf = io.BytesIO()
    canvas.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def write_report(run_dir: str | Path, output: str | Path | None = None, *, png_dir: str | Path | None = None,
                 overview: str | Path | None = None) -> Path:
    """Write the HTML report of ``run_dir`` (default ``RUN_DIR/report.html``) and return its path.

    ``png_dir``: also save each plot there as ``<section>.png``; ``overview``: also write one PNG stacking the
    main plots (:func:`overview_png`, e.g. docs/report-example.png).
    """
    run = load_run_dir(run_dir)
    out = Path(output) if output is not None else run.path / REPORT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    sections = build_sections(run)
    out.write_text(render_html(run, sections), encoding="utf-8")
    if png_dir is not None:
        d = Path(png_dir)
        d.mkdir(parents=True, exist_ok=True)
        for name, png in section_images(sections).items():
            (d / f"{name}.png").write_bytes(png)
    if overview is not None:
        stacked = overview_png(sections)
        if stacked is None:
            raise RunDirError(f"{run.path}: no plot for the overview PNG (no delays, classes, QIs or LDP curves)")
        Path(overview).parent.mkdir(parents=True, exist_ok=True)
        Path(overview).write_bytes(stacked)
    return out
