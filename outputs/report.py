"""What tools/eval.py --report writes: a metric's `report()` (metrics/*.py) as files in the eval folder.

A report is a dict: `columns` and `rows` (the per-class table, one dict per class), `summary` (a few
overall numbers), optionally `confusion` ({"classes", "unit", "matrix"}: rows the label, columns the
prediction). Written: report.md (the table), report.json (the whole dict), and with a confusion
matrix confusion.json, confusion.csv and confusion.png. Registers nothing.
"""
import csv
import json
import os

import numpy as np


def write_report(report, output_dir, title="Evaluation report"):
    """Write `report` into `output_dir`; returns the paths written."""
    os.makedirs(output_dir, exist_ok=True)
    paths = [_write(output_dir, "report.md", markdown(report, title)),
             _write(output_dir, "report.json", json.dumps(report, indent=1))]
    confusion = report.get("confusion")
    if confusion:
        paths.append(_write(output_dir, "confusion.json", json.dumps(confusion)))
        path = os.path.join(output_dir, "confusion.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["label \\ prediction"] + confusion["classes"])
            for name, row in zip(confusion["classes"], confusion["matrix"]):
                w.writerow([name] + row)
        paths += [path, confusion_png(confusion, os.path.join(output_dir, "confusion.png"), title)]
    return paths


def _write(output_dir, name, text):
    path = os.path.join(output_dir, name)
    with open(path, "w") as f:
        f.write(text + "\n")
    return path


def _cell(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v).replace("|", "\\|")


def markdown(report, title):
    cols = report["columns"]
    lines = [f"# {title}", ""]
    lines += [f"- {k}: {_cell(v)}" for k, v in report.get("summary", {}).items()] + [""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" if c == cols[0] else "---:" for c in cols) + "|"]
    lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in report["rows"]]
    if report.get("confusion"):
        lines += ["", f"Confusion matrix ({report['confusion']['unit']}; rows the label, columns the prediction): "
                      "confusion.csv, confusion.json, confusion.png."]
    return "\n".join(lines)


def confusion_png(confusion, path, title="", max_labelled=40):
    """A heat map of the confusion matrix, each row normalised to the label's share (the counts written
    in the cells when there are few classes)."""
    # import cost: matplotlib (~0.5 s) for every run of outputs/, which only --report draws with
    import matplotlib
    matplotlib.use("Agg")   # no display: files only
    import matplotlib.pyplot as plt  # after use("Agg"), which must come first
    cm = np.asarray(confusion["matrix"], np.float64)
    names, n = confusion["classes"], len(confusion["classes"])
    share = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    size = min(3 + 0.45 * n, 14)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the label's " + confusion["unit"])
    if n <= max_labelled:
        ax.set_xticks(range(n), names, rotation=45, ha="right")
        ax.set_yticks(range(n), names)
    if n <= 15:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{int(cm[i, j])}", ha="center", va="center", fontsize=10 if n <= 8 else 7,
                        color="white" if share[i, j] > 0.5 else "black")
    ax.set_xlabel("prediction")
    ax.set_ylabel("label")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
