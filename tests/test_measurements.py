"""Measurements live in docs/performance.md, not in the code: a comment or docstring says why the code
is as it is and links the page (`docs/performance.md#anchor`) for the figures, which otherwise go
stale unseen when the code, the machine or paddle changes. Product tools read no benchmark results."""
import ast
import io
import os
import re
import tokenize

from tests.helpers import ROOT

# the folders of code (tests aside: a test's figures are its expected values)
FOLDERS = ("api", "benchmarks", "data", "deploy", "engine", "metrics", "models", "ops", "readers", "serving", "tools")
NUMBER = r"\d[\d,]*(?:\.\d+)?"
# a figure as a measurement reads: a duration, a size in memory, a speed, a speed ratio, a date
FIGURES = [
    rf"\b{NUMBER}(?:-{NUMBER})?\s?(?:ms|us|µs)\b",
    rf"\b{NUMBER}\s?s(?:/step| a step| per step| a call| per call)\b",
    rf"\b\d+\.\d+(?: ->| against)? (?:\d+\.\d+ )?s\b",
    rf"\b{NUMBER}(?:-{NUMBER})?\s?(?:KB|MB|GB|MiB|GiB)\b",
    rf"\b{NUMBER}\s?(?:GFLOP/s|GB/s|samples/s|tokens/s|req/s|requests/s|clips/s|videos/s|sentences/s)\b",
    rf"\b{NUMBER}(?:-{NUMBER})?x (?:faster|slower|longer)\b",
    rf"\b{NUMBER}(?:-{NUMBER})?% (?:faster|slower|more time|of (?:the|its|a) [\w' .-]*step)\b",
    r"\b20\d\d-\d\d-\d\d\b",
]
# where it was measured (a kind's name in quotes is a name, as in the naming of benchmarks/report.py):
# fine beside a link to the page that holds the figures
MEASURED = [r"\bmeasured(?: on an?\b| on$| at\b| here\b|:)", r"(?<![`'])\b(?:amd-zen\d|intel-[a-z]+rapids)\b(?![`'])"]
LINK = "docs/performance.md"


def _comments(path):
    """(line number, text) of each comment and docstring line of a Python file."""
    text = open(path, encoding="utf-8").read()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            first = body[0].lineno
            out += [(first + i, line) for i, line in enumerate(body[0].value.value.splitlines())]
    return sorted(out)


def measurements_in_comments(root, folders=FOLDERS):
    """'file:line: text' of each comment or docstring line holding a figure, or naming where something
    was measured without linking the page."""
    figures = re.compile("|".join(FIGURES))
    measured = re.compile("|".join(MEASURED), re.IGNORECASE)
    hits = []
    for folder in folders:
        for base, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "results"))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(base, name)
                for line, text in _comments(path):
                    if figures.search(text) or (measured.search(text) and LINK not in text):
                        hits.append(f"{os.path.relpath(path, root)}:{line}: {text.strip()}")
    return hits


def test_no_measurement_in_a_comment():
    hits = measurements_in_comments(ROOT)
    assert not hits, ("figures belong in docs/performance.md (the comment says why and links it):\n"
                      + "\n".join(hits))


def test_the_check_catches_a_figure_and_allows_the_link(tmp_path):
    """A deliberate measurement in a comment and in a docstring fails; the same reason with a link,
    a kind's name in quotes, and code that computes with numbers pass."""
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "x.py").write_text(
        '"""Why: the fused path (measured on an AMD Zen 4: 1.19x faster)."""\n'
        "N = 34  # the step took 2.20 s/step on amd-zen4\n"
        "M = 2  # faster with one pool (docs/performance.md#fused-operators), measured on amd-zen4\n"
        "K = 'amd-zen4'  # a kind's name as `amd-zen4` names it\n")
    hits = measurements_in_comments(str(tmp_path), ("engine",))
    assert [h.split(":")[1] for h in hits] == ["1", "2"], hits


# the tools that measure or count (benchmarks/ is theirs); every other tool is the product's
MEASURING_TOOLS = {"benchmark.py", "amp_check.py", "analyze.py"}
PRODUCT = ("api", "deploy", "engine", "metrics", "models", "ops", "readers", "serving")


def test_product_code_reads_no_benchmark_results():
    """No product tool or package imports benchmarks/ or names its results folder: what a product
    needs of a measurement is a product-side record (configs/macs.json) or the docs."""
    found = []
    paths = [os.path.join(ROOT, "tools", n) for n in sorted(os.listdir(os.path.join(ROOT, "tools")))
             if n.endswith(".py") and n not in MEASURING_TOOLS]
    for folder in PRODUCT:
        for base, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths += [os.path.join(base, n) for n in files if n.endswith(".py")]
    for path in paths:
        text = open(path, encoding="utf-8").read()
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[0] == "benchmarks"]
        if re.search(r"benchmarks[/\"', ]+results", text):
            found.append(f"{os.path.relpath(path, ROOT)} names benchmarks/results")
    assert not found, found
    assert len(paths) > 100


def test_the_performance_page_cites_no_issue_numbers():
    """The lab notes say what was done, not which issue a reader cannot open asked for it."""
    with open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8") as f:
        text = f.read()
    assert not re.findall(r"\bissues? \d+|\bissue-\d+|(?<![\w&/])#\d+\b", text, re.IGNORECASE)
