"""Download pretrained weights into the cache, list the entries, or print the README model-zoo table.

    python tools/download.py --list
    python tools/download.py NAME [NAME ...] [--dir DIR]
    python tools/download.py --all [--dir DIR]
    python tools/download.py --markdown > zoo_table.md

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


def markdown_table():
    lines = ["| Model | Weights | Config | Parameters | Reference metric | Source | Reproduced here |",
             "|---|---|---|---|---|---|---|"]
    for e in sorted(_entries(), key=lambda e: (e.model, e.name)):
        weights = f"`{e.name}`" + ("" if e.urls else " (no release)")
        config = f"[{os.path.basename(e.config)}]({e.config})" if e.config else "-"
        reproduced = e.reproduced
        lines.append("| " + " | ".join(_cell(c) for c in (
            e.model, weights, config, _params(e), _metrics(e), e.metrics_source or "-", reproduced)) + " |")
    return "\n".join(lines)


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
    what.add_argument("--markdown", action="store_true", help="print the README model-zoo table")
    what.add_argument("--all", action="store_true", help="download every entry that has a release")
    parser.add_argument("--dir", help=f"download here instead of the cache ({cache_dir()})")
    args = parser.parse_args(argv)
    if (args.list or args.markdown or args.all) and args.names:
        parser.error("give names or one of --list/--markdown/--all, not both")
    if not (args.list or args.markdown or args.all or args.names):
        parser.error("give entry names, --all, --list or --markdown")
    try:
        components.load_all()
        if args.list:
            print_list()
            return 0
        if args.markdown:
            print(markdown_table())
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
