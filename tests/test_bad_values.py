"""Bad values found by a config fuzz, as a new user would type them: each gives exactly one `error:`
line naming the key or file, exit code 2, and nothing trained or written.

All cases run `tools/train.py`'s own entry point (`cli.run(main)`) in one helper process
(tests/helpers.py `tools_in_one_process`), so paddle is imported once; the exit code and stderr are
what the shell would see.
"""
import os

from tests.conftest import ATTENTION_LSTM_DEMO, TSN_DEMO
from tests.helpers import ROOT, one_error_line, tools_in_one_process


def _cases(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"# caf\xe9 au lait\n_base_: [" + os.path.join(ROOT, ATTENTION_LSTM_DEMO).encode() + b"]\n")
    base5 = tmp_path / "base5.yaml"
    base5.write_text("_base_: 5\nmodel: {name: AttentionLSTM}\n")
    al = ["-c", ATTENTION_LSTM_DEMO]
    return [
        (al + ["-o", "reader.train.num_workers=-1"], ["reader.train.num_workers", "must be >= 0", "-1"]),
        (al + ["-o", "reader.train.num_workers=autox"], ["reader.train.num_workers", "expected int or auto", "'autox'"]),
        (al + ["-o", "lr.values=[-0.1, 0.01]"], ["lr.values must all be >= 0"]),
        (al + ["-o", "train.accum_steps=0"], ["train.accum_steps", "must be >= 1"]),
        (al + ["-o", "train.log_interval=0"], ["train.log_interval", "must be >= 1"]),
        (al + ["-o", "train.save_interval=0"], ["train.save_interval and train.save_steps are both 0"]),
        (al + ["-o", "train.epochs=0"], ["train.epochs", "must be >= 1, got 0"]),
        (al + ["-o", "train.epochs=-1"], ["train.epochs", "must be >= 1, got -1"]),
        (al + ["-o", "train.max_steps=10", "-o", "train.epochs=2"], ["train.epochs or train.max_steps (not both)",
                                                                     "-o train.epochs=null"]),
        (al + ["-o", "model.num_classes=9"], ["model.num_classes is 9", "reader.train (YouTube8M) has 8 classes"]),
        (al + ["-o", "train.best_metric=gapp"], ["train.best_metric 'gapp'", "did you mean 'gap'"]),
        (al + ["-o", "model.lstm_size.x.y=1"], ["-o model.lstm_size.x.y", "model.lstm_size is 64 (int)"]),
        (["-c", str(latin1)], [str(latin1), "not UTF-8", "0xe9"]),
        (["-c", str(base5)], [str(base5), "_base_ must be a path or a list of paths", "5"]),
        (["-c", TSN_DEMO, "-o", "reader.train.transforms.1.size=0"], ["MultiScaleCrop", "size", "0"]),
        (["-c", TSN_DEMO, "-o", "reader.val.transforms.1.size=0"], ["CenterCrop", "size", "0"]),
        # a closed set (a typing.Literal annotation): the key, the allowed values, the value, the near one
        (al + ["-o", "lr.by=epochs"], ["lr.by", "must be one of epoch, step", "'epochs'", "did you mean 'epoch'"]),
    ]


def test_each_bad_value_is_one_error_line_and_exit_2(yt8m_demo, kinetics_demo, tmp_path):
    cases = _cases(tmp_path)
    results = tools_in_one_process([("train", argv + ["--output", tmp_path / f"run{i}"], None)
                                    for i, (argv, _) in enumerate(cases)])
    failures = []
    for i, ((argv, fragments), got) in enumerate(zip(cases, results)):
        line = one_error_line(got)
        if not line or not all(f in line for f in fragments) or os.path.exists(tmp_path / f"run{i}" / "final"):
            failures.append((argv[1:], got))
    assert not failures, "\n".join(f"{a}: exit {g['code']}: {g['stderr'][-600:]}" for a, g in failures)
