"""List the models, the recipes that build them and their trainable parameter counts.

python tools/list_models.py [--no-count]
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import glob
import os

from engine import cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--no-count", action="store_true", help="skip building models to count parameters")
    args = p.parse_args()

    import paddle  # after parsing: --help needs no paddle
    from engine import builder, config
    from engine.components import load_all
    from engine.registry import MODELS
    load_all()
    root = os.path.join(_bootstrap.ROOT, "configs")
    rows = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.yaml"), recursive=True)):
        if "_base_" in path.split(os.sep):
            continue
        cfg = config.load(path)
        count = ""
        if not args.no_count:
            with paddle.LazyGuard():  # full-size models without allocating their weights
                count = f"{builder.count_params(builder.build_model(cfg['model'])):,}"
        rows.append((cfg["model"]["name"], os.path.relpath(path, _bootstrap.ROOT), count))
    print("models: " + ", ".join(m for m in MODELS.names()))
    width = max((len(r[1]) for r in rows), default=10)
    name_width = max((len(r[0]) for r in rows), default=18)
    print(f"{'model':<{name_width}} {'config':<{width}} {'trainable params':>16}")
    for name, path, count in rows:
        print(f"{name:<{name_width}} {path:<{width}} {count:>16}")


if __name__ == "__main__":
    cli.run(main)
