"""The summary that opens docs/performance.md: per CPU kind, ours against PyTorch (fp32 and bf16 samples/s)
and peak memory, as bar charts (plain SVG under docs/images/, no plotting package) and one line of figures,
all from the committed JSON of benchmarks/results/<kind>/ (peers.json, peers_bf16.json, memory.json).

    python benchmarks/summary.py            # print the block
    python benchmarks/summary.py --docs     # write the charts and the block into docs/performance.md
    python benchmarks/summary.py --check    # exit 1 naming what is stale (tests/test_benchmark_results.py)

Run it after benchmarks/peers.py or benchmarks/memory.py has written new JSON; tests/test_benchmark_results.py
fails until the charts and the block match the JSON again.
"""
import argparse
import json
import os
import re
import sys
from xml.sax.saxutils import escape, unescape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import report, tables  # noqa: E402

NAME, KIND = "summary", "all-kinds"        # the block's markers: one block for every kind (tabs)
COMMAND = "benchmarks/summary.py --docs"
IMAGES = os.path.join(report.ROOT, "docs", "images")
# series -> colour: ours in blue shades, PyTorch in orange shades, the same in every chart
COLOURS = {"fp32": "#3f6ec6", "bf16": "#9cb8ea", "ours fp32": "#3f6ec6", "ours bf16": "#9cb8ea",
           "PyTorch fp32": "#e0802c", "PyTorch bf16": "#f2c08f"}
# the sections of the page below the summary, for the line under each kind's charts
SECTIONS = {"peers.json": ("against PyTorch", "against-pytorch-on-the-same-cpu"),
            "peers_bf16.json": ("bf16", "mixed-precision-on-the-cpu-bf16"),
            "memory.json": ("memory of a step", "memory-of-a-training-step"),
            "inference": ("exported models", "exported-models-latency"),
            "readers.json": ("readers", "feeding-an-accelerator-each-reader-alone-at-real-sizes"),
            "serve.json": ("serving", "serving-under-load")}


def _load(kind, name):
    path = os.path.join(report.results_dir(kind), name)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def kinds(root=None):
    """The CPU kinds with a results folder, those with the most of the summary's runs first (the tab
    that opens), then by name."""
    root = root or report.RESULTS
    found = [k for k in os.listdir(root) if os.path.isdir(os.path.join(root, k))]
    return sorted(found, key=lambda k: (-sum(os.path.isfile(os.path.join(root, k, n)) for n in
                                              ("peers.json", "peers_bf16.json", "memory.json")), k))


def speed(kind):
    """(models, {series: {model: ours / PyTorch samples/s}}): fp32 from peers.json, bf16 from peers_bf16.json."""
    series, models = {}, []
    for name, label, key in (("peers.json", "fp32", "ratio"), ("peers_bf16.json", "bf16", "ours_over_theirs_bf16")):
        result = _load(kind, name)
        for row in (result or {}).get("rows", []):
            series.setdefault(label, {})[row["name"]] = row[key]
            models += [row["name"]] if row["name"] not in models else []
    return models, series


def memory(kind):
    """(models, {series: {model: peak MB of the process}}): memory.json's fp32 peaks of both sides (VmHWM
    of one step), else peers_bf16.json's (ru_maxrss: ours fp32 and bf16, PyTorch bf16)."""
    series, models = {}, []
    result = _load(kind, "memory.json")
    if result:
        for row in result["rows"]:
            series.setdefault("ours fp32", {})[row["name"]] = row["ours"]["peak_mb"]
            series.setdefault("PyTorch fp32", {})[row["name"]] = row["theirs"]["peak_mb"]
            models.append(row["name"])
        return models, series
    result = _load(kind, "peers_bf16.json")
    for row in (result or {}).get("rows", []):
        peaks = row.get("peak_memory_mb") or {}
        for key, label in (("ours-fp32", "ours fp32"), ("ours-bf16", "ours bf16"), ("theirs-bf16", "PyTorch bf16")):
            if key in peaks:
                series.setdefault(label, {})[row["name"]] = peaks[key]
        models.append(row["name"])
    return models, series


def _axis(value):
    """(top, step) of an axis from 0 holding `value`: a step of 1, 2, 2.5 or 5 x 10^n, at most 6 steps."""
    scale = 10.0 ** (len(str(int(value))) - 1) if value >= 1 else 0.1
    while True:
        for m in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5):
            step = m * scale
            n = -(-value // step)   # steps, rounded up
            if n <= 6:
                return n * step, step
        scale *= 10


def svg_bars(title, models, series, fmt, reference=None, caption=None):
    """A grouped horizontal bar chart as SVG text: one group per model, one bar per series, the value
    written at the bar's end; `reference` draws a dashed line at that value (1.0: as fast as PyTorch);
    `caption` (the shown title; default `title`) is shorter than the full title a reader's tools see.
    Fixed geometry and number formats, so the same JSON gives the same bytes."""
    names = list(series)
    bar, gap, left, right, top = 11, 9, 104, 40, 42
    width = 340
    plot = width - left - right
    height = top + len(models) * (len(names) * bar + gap) + 26
    vmax, step = _axis(max([v for s in series.values() for v in s.values()] + [reference or 0]))
    x = lambda v: left + plot * v / vmax   # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" font-family="Roboto, Helvetica, Arial, sans-serif" font-size="10">',
           f'<title>{escape(title)}</title>',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="6" y="14" font-size="11.5" font-weight="bold">{escape(caption or title)}</text>']
    lx = 6
    for n in names:   # the legend
        out.append(f'<rect x="{lx}" y="22" width="10" height="10" fill="{COLOURS[n]}"/>')
        out.append(f'<text x="{lx + 14}" y="31">{escape(n)}</text>')
        lx += 22 + 5.5 * len(n)
    for i in range(int(round(vmax / step)) + 1):   # the grid
        v = step * i
        out.append(f'<line x1="{x(v):.1f}" y1="{top - 4}" x2="{x(v):.1f}" y2="{height - 22}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x(v):.1f}" y="{height - 10}" text-anchor="middle" fill="#666">{v:g}</text>')
    y = top
    for m in models:
        group = len(names) * bar
        out.append(f'<text x="{left - 6}" y="{y + group / 2 + 3.5:.1f}" text-anchor="end">{escape(m)}</text>')
        for n in names:
            v = series[n].get(m)
            if v is not None:
                out.append(f'<rect x="{left}" y="{y}" width="{x(v) - left:.1f}" height="{bar - 1}" fill="{COLOURS[n]}"/>')
                out.append(f'<text x="{x(v) + 3:.1f}" y="{y + bar - 2.5:.1f}" fill="#333">{fmt(v)}</text>')
            y += bar
        y += gap
    if reference is not None:
        out.append(f'<line x1="{x(reference):.1f}" y1="{top - 4}" x2="{x(reference):.1f}" y2="{height - 22}" '
                   'stroke="#444" stroke-dasharray="3,2"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _span(values):
    values = sorted(values)
    return f"{values[0]:.2f}" if len(values) == 1 else f"{values[0]:.2f}-{values[-1]:.2f}"


def charts(kind):
    """{file name under docs/images/: SVG text} of one kind: the speed chart where a peer run exists,
    the memory chart where a peak was recorded."""
    out = {}
    models, series = speed(kind)
    if series:
        out[f"perf-{kind}-speed.svg"] = svg_bars(f"{kind}: ours / PyTorch, training samples/s (> 1: ours faster)",
                                                 models, series, lambda v: f"{v:.2f}", reference=1.0,
                                                 caption="Ours / PyTorch, samples/s (> 1: faster)")
    models, series = memory(kind)
    if series:
        out[f"perf-{kind}-memory.svg"] = svg_bars(f"{kind}: peak memory of a training step, MB", models, series,
                                                  lambda v: f"{v:.0f}", caption="Peak memory of a step, MB")
    return out


def _kind_lines(kind):
    """The tab of one kind: the CPU, the figures in one line, its charts, where the rest is."""
    head, figures, note = None, [], None
    models, series = speed(kind)
    for label, values in series.items():
        models_ = f"{len(values)} model{'s' if len(values) > 1 else ''}"
        figures.append(f"ours / PyTorch {label} **{_span(values.values())}** ({models_})")
    for name in ("peers.json", "peers_bf16.json", "memory.json"):
        result = _load(kind, name)
        if result and head is None:
            head = (f"{result['cpu']}, {result['threads']} threads, paddle {result['paddle']}"
                    + (f", torch {result['torch']}" if result.get("torch") else ""))
            note = result.get("cpu_kind_note") and "the kind inferred from a GEMM's speed (the JSON's cpu_kind_note)"
    models, mem = memory(kind)
    if "ours fp32" in mem and "PyTorch fp32" in mem:
        ratio = [mem["ours fp32"][m] / mem["PyTorch fp32"][m] for m in models]
        figures.append(f"process peak memory ours / PyTorch fp32 **{_span(ratio)}**")
    elif "ours bf16" in mem and "PyTorch bf16" in mem:
        ratio = [mem["ours bf16"][m] / mem["PyTorch bf16"][m] for m in models if m in mem["PyTorch bf16"]]
        figures.append(f"process peak memory ours / PyTorch bf16 **{_span(ratio)}**")
    folder = report.results_dir(kind)
    present = [text for name, text in SECTIONS.items() if os.path.exists(os.path.join(folder, name))]
    if any(os.path.isfile(os.path.join(folder, f"{row[0].lower()}.json")) for row in tables.BENCH_TABLE):
        present.insert(0, ("training throughput", "training-and-evaluation-throughput"))
    lines = [f'=== "{kind}"', ""]
    body = [(f"{head}; {note}." if note else f"{head}.") if head else f"No peer run on {kind}.",
            ("; ".join(figures) + "." if figures else "No run against PyTorch on this kind yet."), ""]
    images = [f'![{unescape(re.search(r"<title>(.*)</title>", svg).group(1))}](images/{name}){{ loading="lazy" }}'
              for name, svg in charts(kind).items()]
    if images:
        body += ['<div class="perf-charts" markdown>', "", *images, "", "</div>", ""]
    if present:
        body.append("Measured on this kind: " + ", ".join(f"[{t}](#{a})" for t, a in present) + ".")
    lines += [("    " + b) if b else "" for b in body]
    return lines + [""]


def block_lines(root=None):
    """The block: one tab per kind."""
    lines = ["Per CPU kind (a kind's figures are not comparable with another's); each side's training step on "
             "the same network and shapes, the process's peak memory (`python benchmarks/summary.py --docs`):", ""]
    for kind in kinds(root):
        lines += _kind_lines(kind)
    return lines


def expected():
    """{path: text} of everything the summary writes: the charts and the page with its block."""
    files = {os.path.join(IMAGES, name): svg for kind in kinds() for name, svg in charts(kind).items()}
    with open(report.PERFORMANCE, encoding="utf-8") as f:
        page = f.read()
    files[report.PERFORMANCE] = report.replace_block(page, NAME, KIND, block_lines(), COMMAND)
    return files


def stale():
    """The paths whose committed text differs from what the JSON gives, and charts no kind makes."""
    files = expected()
    out = []
    for path, text in files.items():
        old = open(path, encoding="utf-8").read() if os.path.isfile(path) else None
        if old != text:
            out.append(path)
    made = {os.path.basename(p) for p in files}
    out += [os.path.join(IMAGES, n) for n in sorted(os.listdir(IMAGES)) if n.startswith("perf-") and n not in made]
    return out


def write():
    made = expected()
    for path, text in made.items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    for name in os.listdir(IMAGES):   # a kind's chart that its JSON no longer makes
        if name.startswith("perf-") and name.endswith(".svg") and os.path.join(IMAGES, name) not in made:
            os.remove(os.path.join(IMAGES, name))
    return sorted(made)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--docs", action="store_true", help="write docs/images/perf-*.svg and the page's summary block")
    what.add_argument("--check", action="store_true", help="exit 1 naming each chart or block the JSON would change")
    args = p.parse_args(argv)
    if args.check:
        paths = stale()
        for path in paths:
            print(f"error: {os.path.relpath(path, report.ROOT)} is stale: run python benchmarks/summary.py --docs",
                  file=sys.stderr)
        return 1 if paths else 0
    if args.docs:
        for path in write():
            print(f"wrote {os.path.relpath(path, report.ROOT)}")
        return 0
    print("\n".join(block_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
