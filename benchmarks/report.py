"""Benchmark results per CPU kind: where their JSON lives and the block each kind owns in docs/performance.md.

Our machines are AMD EPYC on some days and Intel Xeon on others, and a speed figure holds for the
kind it was measured on (the Intel cores pay far more for subnormal floats, MKL takes another path on
AMD, ...), and within a vendor for its microarchitecture: the same 2-core "AMD EPYC" is a Zen 4 on
some days (two 256-bit FMA pipes) and was faster than any Zen 4 can be on others (Zen 5's full-width
AVX-512: docs/performance.md#how-speed-is-measured has the GEMM that told them apart). So every
result goes under benchmarks/results/<kind>/, kind = vendor-microarchitecture from /proc/cpuinfo's
family and model (`amd-zen4`, `amd-zen5`, `intel-sapphirerapids`, ...; an unknown one
`<vendor>-f<family>m<model>`), and docs/performance.md holds one block per (table, kind) between the markers

    <!-- NAME KIND: start (COMMAND) -->  ...  <!-- NAME KIND: end -->

`--docs` (alias `--readme`) replaces the block of the kind the JSON was measured on and leaves the
others; a kind with no block yet gets one after the table's last block.
"""
import os
import re
import subprocess

from engine import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PERFORMANCE = os.path.join(ROOT, "docs", "performance.md")   # the page the tables live in
VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}
# (vendor, family) -> [(first model, last model, name)], from AMD's and Intel's family/model tables
MICROARCH = {
    ("amd", 23): [(0x00, 0x2f, "zen"), (0x30, 0xff, "zen2")],
    ("amd", 25): [(0x00, 0x0f, "zen3"), (0x10, 0x1f, "zen4"), (0x20, 0x5f, "zen3"), (0x60, 0xaf, "zen4")],
    ("amd", 26): [(0x00, 0xff, "zen5")],
    ("intel", 6): [(0x55, 0x55, "skylake"), (0x6a, 0x6c, "icelake"), (0x8f, 0x8f, "sapphirerapids"),
                   (0xcf, 0xcf, "emeraldrapids"), (0xad, 0xae, "graniterapids")],
}


def cpu_kind(info=None):
    """'amd-zen4', 'intel-sapphirerapids', ... for a cpu_info() dict (default: this machine's); a
    family or model outside the table gives '<vendor>-f<family>m<model>', no family the vendor alone."""
    if info is None:
        info = cpu.cpu_info()
    vendor = VENDORS.get(info.get("vendor"), (info.get("vendor") or "unknown").lower())
    family, model = info.get("family"), info.get("model_id")
    if family is None:
        return vendor
    for first, last, name in MICROARCH.get((vendor, family), []):
        if model is not None and first <= model <= last:
            return f"{vendor}-{name}"
    return f"{vendor}-f{family}m{model}"


def cpu_record(info=None):
    """The CPU fields every result JSON records (/proc/cpuinfo read once)."""
    if info is None:
        info = cpu.cpu_info()
    return {"cpu": info["model"], "cpu_vendor": info["vendor"], "cpu_family": info["family"],
            "cpu_model_id": info["model_id"], "cpu_kind": cpu_kind(info)}


def results_dir(kind=None):
    return os.path.join(RESULTS, kind or cpu_kind())


def git_commit(root=ROOT):
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _markers(name, kind):
    return (re.compile(rf"<!-- {re.escape(name)} {re.escape(kind)}: start[^>]*-->"),
            f"<!-- {name} {kind}: end -->")


def replace_block(text, name, kind, lines, command):
    """`text` with the block (name, kind) holding `lines`; raises ValueError when the page has no
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


def write_page(name, kind, lines, command, path=None):
    """Write the block (name, kind) into docs/performance.md (or `path`)."""
    path = path or PERFORMANCE
    with open(path) as f:
        text = f.read()
    try:
        text = replace_block(text, name, kind, lines, command)
    except ValueError as e:
        raise SystemExit(f"error: {path}: {e}") from None
    with open(path, "w") as f:
        f.write(text)
