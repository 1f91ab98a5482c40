"""Plot training curves against the optimizer step from the scalars.jsonl of one or several runs:
python tools/plot.py RUN_DIR [RUN_DIR ...] [--keys loss lr top1 ...] [--output FILE.png]

One subplot per key, one line per run (the legend names the run folder); written as PNG and SVG.
Keys: what the trainer logs (loss and the model's other loss terms, lr, samples_per_s) and the
evaluation metrics (top1, miou, gap, ...); an evaluation metric that has the name of a logged training
value is eval/<name> (train/<name> and eval/<name> are always accepted). Default: loss, lr and the
run's train.best_metric (else its first metric). A resumed run logs the steps after its checkpoint
again: the later line of a step counts.
"""
import argparse
import json
import os
import sys

WHERE = ("kind", "step", "epoch", "batch")   # a line's position, not a value to plot


class PlotError(Exception):
    pass


def read_scalars(run_dir):
    """The lines of RUN_DIR/scalars.jsonl (a last line cut by a kill is left out)."""
    path = os.path.join(run_dir, "scalars.jsonl")
    if not os.path.isfile(path):
        raise PlotError(f"{run_dir}: no scalars.jsonl (is it a run folder of tools/train.py, from a version "
                        f"that writes it?)")
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def curves(rows):
    """{key: (steps, values)} of one run, sorted by step, the last line of a step kept."""
    kinds = {kind: {k for r in rows if r.get("kind") == kind for k in r if k not in WHERE}
             for kind in ("train", "eval")}
    out = {}
    for r in rows:
        kind = r.get("kind")
        for k, v in r.items():
            if k in WHERE or kind not in kinds:
                continue
            names = [f"{kind}/{k}"]
            names.append(f"eval/{k}" if kind == "eval" and k in kinds["train"] else k)
            for name in names:
                out.setdefault(name, {})[r["step"]] = v
    return {k: (sorted(d), [d[s] for s in sorted(d)]) for k, d in out.items()}


def plain(metric, available):
    """The name an evaluation metric is plotted under: eval/<name> when a training value has its name."""
    return f"eval/{metric}" if f"train/{metric}" in available else metric


def default_keys(run_dir, available):
    """loss, lr and the run's train.best_metric (else its first metric)."""
    best = None
    try:
        import yaml  # import cost: only the default keys read the run's config.yaml
        with open(os.path.join(run_dir, "config.yaml")) as f:
            best = ((yaml.safe_load(f) or {}).get("train") or {}).get("best_metric")
    except OSError:
        pass
    metrics = [k[len("eval/"):] for k in available if k.startswith("eval/") and k != "eval/num_samples"]
    metric = best if best in metrics else (metrics[0] if metrics else None)
    return [k for k in ("loss", "lr") if k in available] + ([plain(metric, available)] if metric else [])


def plot(run_dirs, keys=None, output=None):
    """Draw the curves; returns (the PNG and SVG paths, {key: {run label: (steps, values)}} as read back
    from the figure's lines)."""
    runs = {}
    for d in run_dirs:
        label = os.path.basename(os.path.normpath(d))
        runs[label if label not in runs else d] = curves(read_scalars(d))
    available = sorted(set().union(*(set(c) for c in runs.values())))
    keys = keys or default_keys(run_dirs[0], available)
    unknown = [k for k in keys if k not in available]
    if unknown or not keys:
        names = [k for k in available if "/" not in k] + [k for k in available if k.startswith("eval/")
                                                          and plain(k[len("eval/"):], available) == k]
        raise PlotError(f"unknown key {', '.join(unknown) or '(none)'}; the runs have: {', '.join(names)}")
    # import cost (docs/performance.md#import-costs): matplotlib after the runs and keys are checked: a wrong one fails at once
    import matplotlib
    matplotlib.use("Agg")   # no display: files only
    import matplotlib.pyplot as plt  # after use("Agg"), which must come first
    fig, axes = plt.subplots(len(keys), 1, figsize=(6.4, 2.2 * len(keys) + 0.6), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        for label, c in runs.items():
            if key in c:
                steps, values = c[key]
                ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, markersize=3, label=label)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    stem = os.path.splitext(output or os.path.join(run_dirs[0], "curves.png"))[0]
    paths = [stem + ".png", stem + ".svg"]
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    for p in paths:
        fig.savefig(p, dpi=100)
    drawn = {key: {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
             for ax, key in zip(axes[:, 0], keys)}
    plt.close(fig)
    return paths, drawn


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders of tools/train.py")
    p.add_argument("--keys", nargs="+", help="what to plot (default: loss, lr, the best_metric)")
    p.add_argument("--output", help="FILE.png (FILE.svg is written beside it; default: curves.png in the "
                                    "first run folder)")
    args = p.parse_args(argv)
    try:
        paths, _ = plot(args.runs, args.keys, args.output)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print("wrote " + ", ".join(paths))


if __name__ == "__main__":
    main()
