"""Claims the docs make about the project that the project itself can settle (issue 65): what `make test`
installs (from the Makefile), the forms table of docs/deployment.md (its rows), and the `--help` of the
data scripts (argparse's own output). Each reads the source of truth at test time, so a new requirement
file, a new row or a renamed flag fails here until the prose follows."""
import contextlib
import glob
import io
import os
import re
import runpy
import sys

import pytest

from tests.helpers import ROOT


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _recipe(makefile, target):
    """The command lines of a Makefile target (the tab-indented lines after `target:`)."""
    lines = makefile.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(target + ":"))
    out = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        out.append(ln.strip())
    return out


def _requirement_files(name, seen=None):
    """`name` and the files it includes with `-r`, in order."""
    seen = [] if seen is None else seen
    seen.append(name)
    for m in re.finditer(r"(?m)^-r\s+(\S+)", _read(name)):
        if m.group(1) not in seen:
            _requirement_files(m.group(1), seen)
    return seen


def make_test_installs():
    """(requirement files, PyPI packages named alone, apt packages) of `make test` beyond requirements.txt."""
    recipe = [ln for ln in _recipe(_read("Makefile"), "$(VENV)/.installed-test") if not ln.startswith("#")]
    files, packages, apt = [], [], []
    for ln in recipe:
        for f in re.findall(r"pip install .*?-r (\S+)", ln):
            files += [r for r in _requirement_files(f) if r not in files]
        packages += re.findall(r"pip install .*--no-deps (\S+?)==", ln)
        apt += re.findall(r"apt-get install (?:-\S+ )*(\S+)\)", ln)
    return files, packages, apt


def _paragraph_on(text, start):
    """The paragraph from `start` to the next blank line, whitespace folded."""
    i = text.index(start)
    end = text.find("\n\n", i)
    return " ".join(text[i:end if end >= 0 else len(text)].split())


def test_the_make_test_installs_are_what_the_makefile_installs():
    files, packages, apt = make_test_installs()
    # what the Makefile holds today, so that a parse that finds nothing cannot pass
    assert {"requirements-test.txt", "requirements-docs.txt", "requirements-onnx.txt"} <= set(files), files
    assert apt == ["iproute2", "chromium"] and packages, (apt, packages)
    readme = _paragraph_on(_read("README.md"), "`make test` needs more than Python and PyPI")
    started = _paragraph_on(_read("docs", "getting-started.md"), "What `make test` adds:")
    for where, text in (("README.md", readme), ("docs/getting-started.md", started)):
        missing = [name for name in files + packages + apt if f"`{name}`" not in text]
        assert not missing, f"{where} does not name what `make test` installs: {missing}\n{text}"
        assert "apt-get" in text and "root" in text, f"{where}: apt-get needs root, and says so nowhere\n{text}"
    assert "any fresh machine" not in _read("README.md")


def test_the_deployment_forms_are_counted_as_the_table_has_rows():
    """The page's first table lists the forms; a count in the sentence above it (a word or digits) is the
    number of rows, or there is none."""
    page = _read("docs", "deployment.md")
    intro, rest = page.split("\n| form |", 1)
    rows = [ln for ln in rest.split("\n\n")[0].splitlines()[1:] if ln.startswith("|") and not ln.startswith("|---")]
    assert len(rows) >= 6, rows
    words = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
    last = intro.rsplit("\n\n", 1)[-1]
    for count in re.findall(r"\b(\w+) forms\b", last):
        if count in words or count.isdigit():
            n = int(count) if count.isdigit() else words.index(count) + 2
            assert n == len(rows), f"deployment.md says {count} forms above {len(rows)} rows"


def _help(script):
    """`python <script> --help` as argparse prints it (run in this process: the data scripts import no
    paddle, and a subprocess per script would cost a second each)."""
    out, argv = io.StringIO(), sys.argv
    sys.argv = [script, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    assert e.value.code == 0, (script, e.value.code)
    return out.getvalue()


DATA_SCRIPTS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "data", "*.py"))
                      if "argparse" in open(p, encoding="utf-8").read())


def check_help(text):
    """What is wrong with a --help text: flags it mentions that the parser does not define, and a
    description that stops mid-sentence (its last paragraph neither ends in . ! ? nor is an indented
    example)."""
    problems = []
    sections = re.split(r"(?m)^(?=(?:positional arguments|options|optional arguments):$)", text)
    head, tail = sections[0], "".join(sections[1:])
    usage, _, description = head.partition("\n\n")
    defined = set(re.findall(r"(?<![\w-])-{1,2}[A-Za-z][\w-]*", usage))
    defined |= {f for ln in tail.splitlines() if re.match(r"\s{2}-", ln)
                for f in re.findall(r"(?<![\w-])-{1,2}[A-Za-z][\w-]*", ln.split("  ")[1] if ln.startswith("  ") else ln)}
    for flag in sorted(set(re.findall(r"(?<![\w/.-])--[a-z][\w-]*[a-z0-9]", text)) - defined):
        problems.append(f"mentions {flag}, which the parser does not define")
    paragraphs = [p for p in description.strip().split("\n\n") if p.strip()]
    if paragraphs:
        last = paragraphs[-1]
        if not (last.rstrip().endswith((".", "!", "?", ".)")) or all(ln.startswith("    ") for ln in last.splitlines())):
            problems.append(f"the description stops mid-sentence: ...{last.strip()[-60:]!r}")
    return problems


@pytest.mark.parametrize("script", DATA_SCRIPTS)
def test_a_data_scripts_help_names_only_its_flags_and_ends_with_a_sentence(script):
    assert not check_help(_help(os.path.join(ROOT, script))), check_help(_help(os.path.join(ROOT, script)))


def test_the_help_check_finds_what_it_should():
    broken = ("usage: x.py [-h] [--no-hard-limit]\n\nTrain it (`--hard-limit` fails otherwise).\n\n"
              "Make the lists (optionally extract frames, or\n\noptions:\n  -h, --help  show this help\n"
              "  --no-hard-limit  allow fewer pieces\n")
    assert check_help(broken) == ["mentions --hard-limit, which the parser does not define",
                                  "the description stops mid-sentence: ...'Make the lists (optionally extract frames, or'"]
    fine = broken.replace("`--hard-limit`", "`--no-hard-limit`").replace(", or\n", ").\n")
    assert check_help(fine) == []
