"""Benchmark results per CPU kind: where their JSON lives and the README block each kind owns.

Our machines are AMD EPYC on some days and Intel Xeon on others, and a speed figure holds for the
kind it was measured on (the Intel cores pay 70-100x for subnormal floats, MKL takes another path on
AMD, ...). So every result goes under benchmarks/results/<kind>/ (kind: `amd`, `intel`, else the
vendor string in lower case), and the README holds one block per (table, kind) between the markers

    <!-- NAME KIND: start (COMMAND) -->  ...  <!-- NAME KIND: end -->

`--readme` replaces the block of the kind the JSON was measured on and leaves the others; a kind
with no block yet gets one after the table's last block.
"""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
KINDS = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}


def cpu_kind(vendor=None):
    """'amd', 'intel' or the vendor in lower case, from a vendor string (default: this machine's)."""
    if vendor is None:
        from engine.cpu import cpu_info
        vendor = cpu_info()["vendor"]
    return KINDS.get(vendor, (vendor or "unknown").lower())


def results_dir(kind=None):
    return os.path.join(RESULTS, kind or cpu_kind())


def kinds():
    """The kinds that have results, sorted."""
    if not os.path.isdir(RESULTS):
        return []
    return sorted(d for d in os.listdir(RESULTS) if os.path.isdir(os.path.join(RESULTS, d)))


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _markers(name, kind):
    return (re.compile(rf"<!-- {re.escape(name)} {re.escape(kind)}: start[^>]*-->"),
            f"<!-- {name} {kind}: end -->")


def replace_block(text, name, kind, lines, command):
    """`text` with the block (name, kind) holding `lines`; raises ValueError when the README has no
    block of that table at all (nowhere to put it)."""
    start_re, end = _markers(name, kind)
    block = f"<!-- {name} {kind}: start ({command}) -->\n" + "\n".join(lines) + "\n" + end
    m = start_re.search(text)
    if m:
        stop = text.find(end, m.end())
        if stop < 0:
            raise ValueError(f"the marker {end!r} is missing")
        return text[:m.start()] + block + text[stop + len(end):]
    ends = list(re.finditer(rf"<!-- {re.escape(name)} [\w.-]+: end -->", text))
    if not ends:
        raise ValueError(f"no '<!-- {name} KIND: start -->' block to put the {kind} table beside")
    at = ends[-1].end()
    return text[:at] + "\n\n" + block + text[at:]


def write_readme(name, kind, lines, command, path=None):
    path = path or README
    with open(path) as f:
        text = f.read()
    try:
        text = replace_block(text, name, kind, lines, command)
    except ValueError as e:
        raise SystemExit(f"error: {path}: {e}") from None
    with open(path, "w") as f:
        f.write(text)
