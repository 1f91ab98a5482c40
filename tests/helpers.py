"""Shared test plumbing: run the tools as a user would, in a subprocess from the repo root."""
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, GLOG_minloglevel="2", PYTHONUNBUFFERED="1")  # conftest set the MKL choice


def tool(name, *args, check=True, timeout=1500, env=None):
    """Run tools/<name>.py with args; returns the CompletedProcess (text)."""
    cmd = [sys.executable, os.path.join(ROOT, "tools", name + ".py"), *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env or ENV)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def launch(nproc, name, *args, log_dir, timeout=600, env=None):
    """python -m paddle.distributed.launch --nproc_per_node N tools/<name>.py ... (CPU, gloo);
    `env` adds to the environment."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(log_dir), os.path.join(ROOT, "tools", name + ".py"), *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**ENV, **(env or {})})
    if proc.returncode != 0:
        logs = ""
        for f in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
            with open(os.path.join(log_dir, f)) as fh:
                logs += f"--- {f}\n" + fh.read()[-3000:]
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}\n{logs}")
    return proc


def logged_losses(output_dir):
    """The train/loss scalars a run wrote to VisualDL (every train.log_interval micro-batches)."""
    from visualdl import LogReader
    vdl = os.path.join(output_dir, "vdl")
    name = [f for f in os.listdir(vdl) if f.startswith("vdlrecords")][0]
    return np.array([r.value for r in LogReader(file_path=os.path.join(vdl, name)).get_data("scalar", "train/loss")])


def max_weight_difference(a, b):
    """max |a - b| over the parameters of two .pdparams files (or run folders: their final/)."""
    # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
    from engine.training.checkpoint import read_weights
    wa, wb = (read_weights(os.path.join(p, "final") if os.path.isdir(os.path.join(p, "final")) else p) for p in (a, b))
    assert wa.keys() == wb.keys()
    return max(float(np.abs(np.asarray(wa[k], np.float64) - np.asarray(wb[k], np.float64)).max()) for k in wa)


class fused_ops_on:
    """The fused operators on (2 threads, as CI's machine has), paddle's CPU threads likewise, the
    library built and loaded; the precision before it again after the block (a module's autouse fixture wraps
    its tests)."""

    def __enter__(self):
        # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
        import paddle
        from ops import functional, library
        paddle.base.core.set_num_threads(2)
        library.set_threads(2)
        assert library.load(), library.state["error"]
        self.on = functional.precision(fast_ops=True)
        self.on.__enter__()

    def __exit__(self, *exc):
        self.on.__exit__(*exc)


class counting_fused_ops:
    """Count the fused operators (ops/functional.py) run inside the block: a fast path that silently fell
    back to the reference would make a comparison of the two vacuous."""

    def __enter__(self):
        # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
        from ops import functional
        self.ops, self.names, self.real = functional, [], functional._run
        functional._run = lambda name, *a: self.names.append(name) or self.real(name, *a)
        return self.names

    def __exit__(self, *exc):
        self.ops._run = self.real


# Under bf16 (the op_path fixture's "bf16" path), matmul and convolution round their operands to 8
# significant bits: a golden float array passes when ||ours - ref|| / ||ref|| <= 2e-2 (issue 22).
BF16_RTOL = 2e-2
BF16_OPS = {"zoo_matmul": "zoo_linear_bf16", "zoo_conv2d": "zoo_conv2d_bf16",   # linear layers' GEMMs
            "zoo_lstm": "zoo_lstm_bf16", "zoo_lstm_infer": "zoo_lstm_bf16_infer"}
BF16_ACT_OPS = {"zoo_conv2d": "zoo_conv2d_bf16act"}   # under Precision.bf16_act (the "bf16act" path)


def _bf16():
    # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
    from ops import current_precision
    return current_precision().bf16 or current_precision().bf16_act


def golden_close(ours, ref):
    """The golden README's tolerance, atol 1e-4 * max(1, max|ref|) plus rtol 1e-4; under bf16 the
    relative norm BF16_RTOL. Returns the max abs difference."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    diff = np.abs(ours - ref)
    if _bf16():
        rel = np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30)
        assert rel <= BF16_RTOL, f"bf16: relative norm difference {rel:.3g}"
        return diff.max()
    tol = 1e-4 * max(1.0, float(np.abs(ref).max())) + 1e-4 * np.abs(ref)
    assert (diff <= tol).all(), f"max abs diff {diff.max()}"
    return diff.max()


def golden_stats_close(x, stats):
    """x against the golden stats of an array (mean, std, l2, min, max, mean |x|): rtol 1e-4 (the mean
    within 1e-4 std); under bf16 the norm, std and mean within BF16_RTOL (of the norm, the std)."""
    x = np.asarray(x, np.float64)
    mean, std, l2, lo, hi, mean_abs = stats
    if _bf16():
        assert abs(np.sqrt((x ** 2).sum()) - l2) <= BF16_RTOL * l2
        assert abs(x.std() - std) <= BF16_RTOL * std and abs(x.mean() - mean) <= BF16_RTOL * std
        return
    assert abs(x.mean() - mean) <= 1e-4 * std
    np.testing.assert_allclose([x.std(), np.sqrt((x ** 2).sum()), x.min(), x.max(), np.abs(x).mean()],
                               [std, l2, lo, hi, mean_abs], rtol=1e-4)


class OpPath:
    """Which operator path a test runs on (the `op_path` fixture) and the fused operators seen so far."""

    def __init__(self, fused, ran, bf16=False, bf16_act=False):
        self.fused, self.ran, self.bf16, self.bf16_act = fused, ran, bf16, bf16_act

    def check(self, *names):
        """The fused path ran at least these operators (their bf16 forms on the bf16 and bf16act paths);
        the reference path ran none. A model with no fused operator passes no names: then both paths
        are the same code, and that is asserted."""
        seen = sorted(set(self.ran))
        names = [BF16_OPS.get(n, n) for n in names] if self.bf16 else names
        names = [BF16_ACT_OPS.get(n, n) for n in names] if self.bf16_act else names
        if self.fused and names:
            assert set(names) <= set(seen), f"the fused path did not run {sorted(set(names) - set(seen))}: {seen}"
        else:
            assert not seen, f"fused operators ran on the {'fused' if self.fused else 'reference'} path: {seen}"


def nsp_majority(run_dir):
    """(share of the majority next-sentence label, number of pairs) of a BERT pretraining run's val
    pairs, rebuilt from its resolved config and seed (the reader makes them on the fly)."""
    # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
    from engine import builder, config
    from engine.components import load_all
    load_all()
    cfg = config.load(os.path.join(run_dir, "config.yaml"))
    val = builder.build_dataset(cfg, "val", cfg["runtime"]["seed"])
    random_share = sum(int(val[i]["next_sentence_label"]) for i in range(len(val))) / len(val)
    return max(random_share, 1 - random_share), len(val)


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return json.load(f)


def assert_one_line_error(proc, *fragments):
    """A user error: non-zero exit, one `error:` line on stderr naming what is wrong, no traceback."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


_DRIVER = r"""
import contextlib, io, json, os, runpy, sys
sys.path.insert(0, "tools")
import _bootstrap  # the tools' environment, before paddle is imported
from engine import session
made = []   # the engine.session.Session objects the current run constructs
_init = session.Session.__init__
session.Session.__init__ = lambda self, *a, **k: made.append(1) or _init(self, *a, **k)
out = []
for tool, argv, env in json.loads(sys.argv[1]):
    sys.argv = [f"tools/{tool}.py"] + argv
    os.environ.update(env)
    err, std, code = io.StringIO(), io.StringIO(), 0
    made.clear()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        try:
            runpy.run_path(f"tools/{tool}.py", run_name="__main__")
        except SystemExit as e:
            code = e.code
    out.append({"code": code or 0, "stdout": std.getvalue(), "stderr": err.getvalue(), "sessions": len(made)})
print(json.dumps(out))
"""


def tools_in_one_process(runs, timeout=600, env=None):
    """Run several tool invocations [(tool, [args], {env})] through their own entry points in ONE
    helper process (paddle imported once; `env` adds to its environment); returns [{code, stdout,
    stderr, sessions}] as a shell would see them, `sessions` the engine.session.Session objects built."""
    runs = [(t, [str(a) for a in argv], env or {}) for t, argv, env in runs]
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(runs)], cwd=ROOT, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_error_line(result):
    """The single `error:` line of a failed run, or None when the run does not look like that."""
    lines = [ln for ln in result["stderr"].splitlines() if ln.strip()]
    if result["code"] == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        return lines[0]
    return None


def peaked_transformer(**settings):
    """(model, source ids [6, 7]): a small random post-norm Transformer in eval mode with its matrices
    scaled up, so its distributions are peaked and beam search keeps hypotheses of several lengths (a
    random model at the usual scale repeats one token); row 4 is a shorter, padded sentence. It decodes
    with the length-penalty search (limit |source| + 4) unless `beam_search_version="v1"` is given."""
    # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
    import paddle
    from models.nlp.transformer import Transformer
    if settings.setdefault("beam_search_version", "length_penalty") == "length_penalty":
        settings = {"max_len_a": 1.0, "max_len_b": 4, **settings}
    paddle.seed(1)
    m = Transformer(src_vocab_size=24, trg_vocab_size=24, d_model=32, d_inner_hid=64, n_head=4, num_encoder_layers=2,
                    num_decoder_layers=2, max_length=30, dropout=0.0, normalize_before=False, **settings)
    for p in m.parameters():
        if p.ndim == 2:
            p.set_value(p.numpy() * 3)
    m.eval()
    src = np.random.default_rng(0).integers(3, 24, size=(6, 7))
    src[:, -1] = 1
    src[4, 3:] = [1, 0, 0, 0]
    return m, src


def gradients_with_and_without(model, switch, batch, layer, seed=7):
    """[(loss, {name: gradient}, forward calls of `layer`), ...] of one training step with
    `switch(model, False)` then `switch(model, True)`: the same seed, so dropout draws alike; a
    recomputing step runs `layer` twice (forward and again in backward)."""
    # import cost: paddle (~2.5 s) for every test session (conftest imports helpers)
    import paddle
    calls = []
    hook = layer.register_forward_post_hook(lambda *a: calls.append(1))
    runs = []
    for on in (False, True):
        switch(model, on)
        model.train()
        model.clear_gradients()
        calls.clear()
        paddle.seed(seed)
        loss = model(batch)["loss"]
        loss.backward()
        runs.append((loss.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()
                                   if p.grad is not None}, len(calls)))
    hook.remove()
    return runs


def doc_blocks(path, lang):
    """The fenced ```lang code blocks of a markdown file, in order."""
    with open(path, encoding="utf-8") as f:
        return re.findall(rf"^```{lang}\n(.*?)^```$", f.read(), re.S | re.M)


def openvino_bf16_without_kernels():
    """Under an ONEDNN_MAX_CPU_ISA cap below AVX-512 on a CPU with bf16 (`make test-isa`), OpenVINO still
    lists BF16 (its list reads the CPU) but its kernels have none: a bf16 compile or inference fails. No
    real CPU is in that state (one without bf16 lists none); under AVX512_CORE its oneDNN emulates bf16
    (jit_avx512_bf16 convolutions, seen). The tests that mock OpenVINO's bf16 ask this."""
    from engine.cpu import has_bf16, isa_allows
    return has_bf16({}) and not isa_allows("AVX512_CORE")
