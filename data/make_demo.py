"""Generate the small demo datasets (real formats) that the demo recipes and the tests train on.

python data/make_demo.py [youtube8m] [kinetics] [translation] [bert] [coco] [segmentation] [--root data]
                                                                                         (default: all)
Each dataset is written once; a `DONE` marker makes later calls no-ops.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _youtube8m(root):
    from data import demo_youtube8m  # import cost (docs/performance.md#import-costs): the six generators together; --help loads none
    return demo_youtube8m.make(os.path.join(root, "youtube8m_demo"))


def _kinetics(root):
    from data import demo_kinetics  # import cost (docs/performance.md#import-costs): the six generators together; --help loads none
    return demo_kinetics.make(os.path.join(root, "kinetics_demo"))


def _translation(root):
    from data import demo_translation  # import cost (docs/performance.md#import-costs): the six generators together; --help loads none
    return demo_translation.make(os.path.join(root, "translation_demo"))


def _bert(root):
    from data import demo_bert  # import cost (docs/performance.md#import-costs): the six generators together; --help loads none
    return demo_bert.make(os.path.join(root, "bert_demo"))


def _coco(root):
    from data import demo_coco  # import cost (docs/performance.md#import-costs): the six generators together; --help loads none
    return demo_coco.make(root)


def _segmentation(root):
    from data import demo_segmentation  # import cost (docs/performance.md#import-costs): the six generators together; --help loads none
    return demo_segmentation.make(os.path.join(root, "voc_demo"))


GENERATORS = {"youtube8m": _youtube8m, "kinetics": _kinetics, "translation": _translation, "bert": _bert,
              "coco": _coco, "segmentation": _segmentation}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("names", nargs="*", help=f"datasets among: {', '.join(GENERATORS)}")
    p.add_argument("--root", default=HERE)
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in GENERATORS]
    if unknown:
        p.error(f"unknown demo dataset {unknown[0]!r}; known: {', '.join(GENERATORS)}")
    for name in args.names or list(GENERATORS):
        GENERATORS[name](args.root)
        print(f"demo data '{name}' ready under {args.root}")


if __name__ == "__main__":
    main()
