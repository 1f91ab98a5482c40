"""Download pretrained weights into the cache, list the entries, or print or write the model-zoo table.

    python tools/download.py --list
    python tools/download.py NAME [NAME ...] [--dir DIR]
    python tools/download.py --all [--dir DIR]
    python tools/download.py --markdown > zoo_table.md
    python tools/download.py --docs [PATH]      (rewrites the table in docs/model-zoo.md)

The cache is `$PADDLE_ZOO_HOME/weights` (default `~/.cache/paddle_zoo/weights`). Offline, place a file
by hand at the path the error names and it is used without network access.

Exit codes, as every tool's (engine.cli.run): 0 when every name was fetched; 2 with one `error: ...` line
per name that failed (an unknown name, with a did-you-mean when one is close, an entry without a release,
a failed download) and for bad arguments; 1 for anything else (a disk error, a component module that
does not import); 130 when interrupted.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bootstrap  # noqa: E402,F401  (environment before paddle)

import argparse  # noqa: E402
import json  # noqa: E402

from engine import components  # noqa: E402
from engine.errors import ConfigError  # noqa: E402
from engine.weights.download import cache_dir  # noqa: E402
from engine.weights.pretrained import WEIGHTS, resolve_weights  # noqa: E402

_NOT_RATIOS = {"bleu", "loss", "ppl", "num_samples"}


def _metric_text(name, value):
    if name in _NOT_RATIOS or not isinstance(value, (int, float)) or value > 1:
        return f"{name} {value:.2f}" if isinstance(value, float) else f"{name} {value}"
    return f"{name} {100 * value:.2f}%"


def _metrics(entry):
    text = ", ".join(_metric_text(k, v) for k, v in entry.metrics.items())
    if text and entry.dataset:
        text += f" ({entry.dataset})"
    return text or "-"


def _params(entry):
    return f"{entry.num_params / 1e6:.2f} M" if entry.num_params else "-"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what `python tools/analyze.py --all --json configs/macs.json` counted for each recipe (a record of the
# recipes, not a measurement: a product tool reads no benchmark results)
FLOPS_JSON = os.path.join(ROOT, "configs", "macs.json")


def _macs_records(path=FLOPS_JSON):
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("recipes", {})


def _macs(entry, records):
    """The recipe's multiply-adds at its input shape (benchmarks/flops.py), e.g. "12.26 G (3 seg x 224x224)"."""
    record = records.get(entry.config) if entry.config else None
    if not record:
        return "-"
    n = record["macs"]
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix} ({record['input']})"
    return f"{n} ({record['input']})"


def _entries():
    return [WEIGHTS.get(n) for n in WEIGHTS.names()]


def print_list():
    rows = [("NAME", "MODEL", "PARAMS", "REFERENCE METRICS", "URL")]
    for e in _entries():
        rows.append((e.name, e.model, _params(e), _metrics(e), e.urls[0] if e.urls else "no release"))
    if len(rows) == 1:
        print("no pretrained entries are registered")
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _breakable(name, after="_"):
    """An entry or file name (a path: after="/") that a narrow column may wrap after its underscores
    (slashes) only (<wbr>), never inside a word: a whole name is wider than the column at 1280 px."""
    return name.replace(after, after + "<wbr>")


def markdown_table(link_prefix=""):
    """The model-zoo tables; `link_prefix` goes before each config link (`../` from docs/). Two tables
    of the same rows: what each entry is, then its reference metric, source and what was checked;
    eight columns of one table run off the page at 1280 px."""
    what = ["| Model | Weights | Config | Parameters | MACs (input) |", "|---|---|---|---|---|"]
    how = ["| Weights | Reference metric | Source | Reproduced here |", "|---|---|---|---|"]
    records = _macs_records()
    for e in sorted(_entries(), key=lambda e: (e.model, e.name)):
        weights = f"<code>{_breakable(e.name)}</code>" + ("" if e.urls else " (no release)")
        config = (f"[{_breakable(os.path.basename(e.config))}]({link_prefix}{e.config})" if e.config else "-")
        what.append("| " + " | ".join(_cell(c) for c in (e.model, weights, config, _params(e), _macs(e, records)))
                    + " |")
        how.append("| " + " | ".join(_cell(c) for c in (f"<code>{_breakable(e.name)}</code>", _metrics(e),
                                                          _breakable(e.metrics_source or "-", "/"),
                                                          e.reproduced)) + " |")
    return "\n".join(what + ["", "Where each reference metric comes from, and what was checked here:", ""] + how)


DOCS_PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "model-zoo.md")
TABLE_BEGIN = "<!-- model-zoo table: generated by `python tools/download.py --docs`, do not edit by hand -->"
TABLE_END = "<!-- end of the generated model-zoo table -->"
DOCS_INTRO = """# Model zoo

Every pretrained entry of the zoo, generated from the entries themselves (`python tools/download.py
--docs` rewrites the table below; `python tools/download.py --list` prints the same entries with their
URLs, `python tools/download.py NAME` downloads one into the cache). "Reference metric" is the
publisher's number on the full dataset, with its source; "Reproduced here" says what was checked on
our 2-core CPU machines (no GPU, none of the full datasets). An entry marked "no release" has no
official file: it names the recipe and the publisher's number only. "MACs (input)" is the recipe's
multiply-adds in one forward of one sample of the input named beside it (FLOPs = 2 x MACs; convolutions,
linear layers, matrix products and LSTM cells are counted, element-wise operations, norms and softmax are
not), as `python tools/analyze.py --all --json configs/macs.json` counted them
([analyze](tools.md#analyze)).

"""


def docs_page(old=None):
    """docs/model-zoo.md with a fresh table: the text around the markers of `old` is kept; without
    `old` (or without both markers in it) the page is the default introduction and the table."""
    table = f"{TABLE_BEGIN}\n\n{markdown_table('../')}\n\n{TABLE_END}"
    if old and TABLE_BEGIN in old and TABLE_END in old:
        head, rest = old.split(TABLE_BEGIN, 1)
        return head + table + rest.split(TABLE_END, 1)[1]
    return DOCS_INTRO + table + "\n"


def write_docs(path):
    old = open(path, encoding="utf-8").read() if os.path.isfile(path) else None
    new = docs_page(old)
    if new != old:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{path}: {'unchanged' if new == old else 'written'}")


def fetch(names, root):
    """Download each name (entry or URL); an error on one does not stop the others. Returns the exit
    code: 2 if any name failed (one `error:` line each), else 0."""
    failed = 0
    for name in names:
        try:
            if not name.lower().startswith(("http://", "https://")):
                WEIGHTS.get(name)  # an unknown name lists the known ones (and the closest)
            path, _ = resolve_weights(name, root=root)
            print(f"{name}: {path}")
        except ConfigError as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            failed += 1
    return 2 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="pretrained entry names (or URLs)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the pretrained entries")
    what.add_argument("--markdown", action="store_true", help="print the model-zoo table (Markdown)")
    what.add_argument("--docs", nargs="?", const=DOCS_PAGE, metavar="PATH",
                      help="rewrite the table of the docs page (default docs/model-zoo.md)")
    what.add_argument("--all", action="store_true", help="download every entry that has a release")
    parser.add_argument("--dir", help=f"download here instead of the cache ({cache_dir()})")
    args = parser.parse_args(argv)
    if (args.list or args.markdown or args.docs or args.all) and args.names:
        parser.error("give names or one of --list/--markdown/--docs/--all, not both")
    if not (args.list or args.markdown or args.docs or args.all or args.names):
        parser.error("give entry names, --all, --list, --markdown or --docs")
    try:
        components.load_all()
        if args.list:
            print_list()
            return 0
        if args.markdown:
            print(markdown_table())
            return 0
        if args.docs:
            write_docs(args.docs)
            return 0
        names = args.names
        if args.all:
            names = [e.name for e in _entries() if e.urls]
            for e in _entries():
                if not e.urls:
                    print(f"{e.name}: skipped, no released weights")
        return fetch(names, args.dir)
    except ConfigError as e:  # bad input: exit 2, as engine.cli.run
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"error: cannot import the component modules (their packages' COMPONENTS): {e}", file=sys.stderr)
    except OSError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
