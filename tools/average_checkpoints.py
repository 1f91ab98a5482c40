"""Average the weights of the last N checkpoints of a run ("Attention is all you need": the last 5
checkpoints for base models, the last 20 for big ones), into one .pdparams file for eval/infer.

    python tools/average_checkpoints.py output/RUN --last 5 [--output output/RUN/averaged.pdparams]
    python tools/average_checkpoints.py CKPT_DIR CKPT_DIR ... --output averaged.pdparams

A run directory (or its checkpoints/ folder) gives its newest N complete checkpoints by optimizer
step (keep `train.keep_last` >= N while training, and use `train.save_steps` for step intervals);
explicit checkpoint directories or .pdparams files are averaged as given. Floating-point tensors
are averaged in float64 and stored in their own dtype; other tensors must be equal in every file.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import os

from engine import cli
from engine.errors import ConfigError


def checkpoints_to_average(paths, last):
    """The files to average: the newest `last` checkpoints of one run folder, or the paths given."""
    from engine.training.checkpoint import list_checkpoints   # loads paddle: after the flags are parsed
    if len(paths) == 1 and os.path.isdir(paths[0]) and not os.path.isfile(os.path.join(paths[0], "model.pdparams")):
        root = paths[0]
        if os.path.isdir(os.path.join(root, "checkpoints")):
            root = os.path.join(root, "checkpoints")
        found = [path for _, path in list_checkpoints(root)]
        if last is None:
            raise ConfigError(f"{paths[0]}: a run folder: say how many of its newest checkpoints to average (--last N)")
        if len(found) < last:
            raise ConfigError(f"{root} holds {len(found)} complete checkpoints, fewer than --last {last}; train with "
                              f"train.keep_last >= {last} (and train.save_steps or save_interval) to keep them")
        return found[-last:]
    if last is not None and last != len(paths):
        raise ConfigError(f"--last {last} with {len(paths)} checkpoints given: give a run folder, or drop --last")
    return paths


def average(paths):
    """{key: array} averaged over the weights files or checkpoint directories `paths`."""
    import numpy as np  # after the flags are parsed: --help loads no numpy (docs/performance.md#import-costs)

    from engine.training.checkpoint import read_weights   # loads paddle: after the flags are parsed
    if len(paths) < 2:
        raise ConfigError(f"averaging needs at least 2 checkpoints, got {len(paths)}")
    total, first, dtypes = {}, None, {}
    for path in paths:
        state = {k: np.asarray(v) for k, v in read_weights(path).items()}
        if first is None:
            first = path
            dtypes = {k: v.dtype for k, v in state.items()}
            total = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in state.items()}
            shapes = {k: v.shape for k, v in state.items()}
            continue
        if set(state) != set(total):
            extra, missing = sorted(set(state) - set(total)), sorted(set(total) - set(state))
            raise ConfigError(f"{path} and {first} hold different keys (only in {path}: {extra[:3]}; only in "
                              f"{first}: {missing[:3]}): checkpoints of different models")
        for key, value in state.items():
            if value.shape != shapes[key]:
                raise ConfigError(f"{path}: {key} has shape {list(value.shape)}, {first} {list(shapes[key])}")
            if dtypes[key].kind == "f":
                total[key] += value
            elif not np.array_equal(total[key], value):
                raise ConfigError(f"{path}: the non-float tensor {key} differs from {first}; cannot average it")
    return {k: (v / len(paths)).astype(dtypes[k]) if dtypes[k].kind == "f" else v for k, v in total.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="a run folder (with --last) or checkpoint directories / .pdparams files")
    p.add_argument("--last", type=int, help="average the newest N checkpoints of the run folder")
    p.add_argument("--output", help="the averaged .pdparams (default: RUN/averaged_last<N>.pdparams)")
    args = p.parse_args()
    if args.last is not None and args.last < 2:
        raise ConfigError(f"--last must be >= 2, got {args.last}")
    paths = checkpoints_to_average(args.paths, args.last)
    output = args.output
    if output is None:
        if len(args.paths) != 1:
            raise ConfigError("--output is required when checkpoints are listed one by one")
        output = os.path.join(args.paths[0], f"averaged_last{len(paths)}.pdparams")
    averaged = average(paths)
    import paddle  # after the flags are parsed: --help needs no paddle
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    paddle.save({k: paddle.to_tensor(v) for k, v in averaged.items()}, output + ".tmp")
    os.replace(output + ".tmp", output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(os.path.normpath(x)) for x in paths)}) "
          f"into {output}")


if __name__ == "__main__":
    cli.run(main)
