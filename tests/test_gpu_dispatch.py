"""Linear and attention as GPU kits run them (issue 38, item 1), proven on the CPU: a tensor whose
place says GPU (Place.is_gpu_place / is_cpu_place patched: the test's stand-in for a GPU tensor)
takes F.linear (no bias-in-matmul concat) and paddle's scaled_dot_product_attention; real CPU
tensors keep the CPU path, and SDPA's fp32 math on the CPU equals our reference attention."""
import numpy as np
import paddle
import pytest

from ops import functional as fn
from ops import layers, reference

Place = type(paddle.zeros([1]).place)


@pytest.fixture
def gpu_place(monkeypatch):
    """Every dynamic-graph tensor reports a GPU place, with the fused CPU path off (the GPU's path)."""
    monkeypatch.setattr(Place, "is_cpu_place", lambda self: False)
    monkeypatch.setattr(Place, "is_gpu_place", lambda self: True)
    with fn.precision(fast_ops=False):
        yield


class _Counting:
    """Wrap a function of a module and count its calls."""

    def __init__(self, monkeypatch, module, name):
        self.calls, original = 0, getattr(module, name)

        def wrapped(*a, **k):
            self.calls += 1
            return original(*a, **k)
        monkeypatch.setattr(module, name, wrapped)


def _qkv(seed=0, b=2, h=4, s=5, t=7, d=8):
    rng = np.random.default_rng(seed)
    q, k, v = (paddle.to_tensor(rng.standard_normal(shape).astype("float32"), stop_gradient=False)
               for shape in ((b, h, s, d), (b, h, t, d), (b, h, t, d)))
    return q, k, v


def _masks(b=2, s=5, t=7):
    pad = np.zeros([b, 1, 1, t], np.float32)
    pad[1, :, :, 5:] = -1e9                                  # a padded key row
    causal = np.triu(np.full([s, t], -1e9, np.float32), 3)[None, None]   # a [1, 1, S, T] future mask
    return [None, paddle.to_tensor(pad), paddle.to_tensor(causal)]


@pytest.mark.parametrize("mask_id", [0, 1, 2])
def test_sdpa_on_cpu_tensors_equals_the_reference_attention_forward_and_backward(mask_id):
    import paddle.compat.nn.functional as compat_F
    mask = _masks()[mask_id]
    got, want = [], []
    for f, out in ((lambda q, k, v: compat_F.scaled_dot_product_attention(q, k, v, attn_mask=mask), got),
                   (lambda q, k, v: reference.attention(q, k, v, mask), want)):
        q, k, v = _qkv()
        y = f(q, k, v)
        (y * paddle.arange(y.size, dtype="float32").reshape(y.shape) / y.size).sum().backward()
        out += [y.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_gpu_tensor_takes_sdpa_and_f_linear_without_the_concat(gpu_place, monkeypatch):
    import paddle.compat.nn.functional as compat_F
    sdpa = _Counting(monkeypatch, compat_F, "scaled_dot_product_attention")
    concat = _Counting(monkeypatch, paddle, "concat")
    f_linear = _Counting(monkeypatch, paddle.nn.functional, "linear")
    q, k, v = _qkv()
    y = layers.attention(q, k, v, _masks()[1], p=0.1, training=False)   # eval: no dropout, as the reference
    y.sum().backward()
    assert sdpa.calls == 1
    lin = paddle.nn.Linear(8, 6)
    x = paddle.rand([3, 4, 8])
    x.stop_gradient = False
    out = layers.linear(x, lin, act="relu")
    out.sum().backward()
    assert concat.calls == 0 and f_linear.calls == 1 and lin.bias.grad is not None
    monkeypatch.undo()   # the CPU again (patched functions restored): the same numbers
    with fn.precision(fast_ops=False):
        np.testing.assert_allclose(layers.attention(q, k, v, _masks()[1]).numpy(), y.numpy(), atol=1e-6)
        np.testing.assert_allclose(layers.linear(x, lin, act="relu").numpy(), out.numpy(), atol=1e-6)


def test_cpu_tensors_keep_the_bias_in_the_matmul(monkeypatch):
    """The trick measured to pay on our CPUs stays where it was (fused path off: the reference)."""
    concat = _Counting(monkeypatch, paddle, "concat")
    sdpa_calls = []
    import paddle.compat.nn.functional as compat_F
    monkeypatch.setattr(compat_F, "scaled_dot_product_attention", lambda *a, **k: sdpa_calls.append(1))
    lin = paddle.nn.Linear(8, 6)
    x = paddle.rand([3, 8])
    x.stop_gradient = False
    with fn.precision(fast_ops=False):
        layers.linear(x, lin).sum().backward()
        layers.attention(*_qkv(), _masks()[1])
    assert concat.calls == 2 and not sdpa_calls   # the ones column and the [W; b] weight


def test_dropout_in_sdpa_only_when_training(gpu_place, monkeypatch):
    import paddle.compat.nn.functional as compat_F
    seen = []
    monkeypatch.setattr(compat_F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, dropout_p=0.0, **kw: seen.append(dropout_p) or q)
    q, k, v = _qkv()
    layers.attention(q, k, v, None, p=0.1, training=True)
    layers.attention(q, k, v, None, p=0.1, training=False)
    assert seen == [0.1, 0.0]


def test_post_norm_add_and_norm_takes_paddles_fused_kernel_on_a_gpu(gpu_place, monkeypatch):
    """fused_bias_dropout_residual_layer_norm (GPU kernel: float32, float16; it has no CPU kernel, so
    only its call is checked here) with the layer's own arguments; bf16 and CPU tensors compose."""
    import paddle.incubate.nn.functional as incubate_F
    seen = []

    def fake(x, residual, bias=None, ln_scale=None, ln_bias=None, dropout_rate=0.5, ln_epsilon=1e-5,
             training=True, mode="upscale_in_train", name=None):
        seen.append((x, residual, bias, ln_scale, ln_bias, dropout_rate, ln_epsilon, training, mode))
        return x
    monkeypatch.setattr(incubate_F, "fused_bias_dropout_residual_layer_norm", fake)
    x, r = paddle.rand([2, 3, 8]), paddle.rand([2, 3, 8])
    b, w, nb = paddle.rand([8]), paddle.rand([8]), paddle.rand([8])
    fn.bias_dropout_residual_ln(x, b, r, w, nb, p=0.1, eps=1e-12, training=True)
    fn.bias_dropout_residual_ln(x, None, r, w, nb, p=0.1, eps=1e-12, training=False)
    assert [s[5:] for s in seen] == [(0.1, 1e-12, True, "upscale_in_train"), (0.0, 1e-12, False, "upscale_in_train")]
    assert seen[0][0] is x and seen[0][1] is r and seen[0][2] is b and seen[0][3] is w and seen[0][4] is nb
    assert seen[1][2] is None
    composed = []   # (the CPU has no bf16 add to run the composition itself)
    monkeypatch.setattr(reference, "bias_dropout_residual", lambda *a, **k: composed.append(1) or x)
    fn.bias_dropout_residual_ln(x.astype("bfloat16"), None, r.astype("bfloat16"), w, nb, training=False)
    assert len(seen) == 2 and composed == [1]
    monkeypatch.setattr(Place, "is_gpu_place", lambda self: False)
    monkeypatch.setattr(Place, "is_cpu_place", lambda self: True)
    fn.bias_dropout_residual_ln(x, b, r, w, nb, training=False)
    assert len(seen) == 2 and composed == [1, 1]
    monkeypatch.setattr(Place, "is_gpu_place", lambda self: True)   # the layer-level entry reaches it too
    norm, proj = paddle.nn.LayerNorm(8, epsilon=1e-12), paddle.nn.Linear(8, 8)
    layers.linear_add_norm(x, proj, r, norm, p=0.1, training=True)
    assert len(seen) == 3 and seen[2][2] is proj.bias and seen[2][3] is norm.weight and seen[2][5:7] == (0.1, 1e-12)


# ------------------------------------------------------------------------------ GPU inference settings
class _RecordingConfig:
    """paddle.inference.Config's stand-in: records what the predictor asks of it."""
    calls = []

    def __init__(self, *files):
        self.calls.append(("Config", tuple(files)))

    def __getattr__(self, name):   # (name, positional args), with a dict of keyword args where given
        return lambda *a, **k: self.calls.append((name, a, k) if k else (name, a))


class _FakePredictor:
    def __init__(self, names):
        self.names = names

    def get_input_names(self):
        return self.names


def _fake_export(tmp_path, precision="fp32"):
    import yaml
    spec = {"inputs": [{"name": "x", "shape": [-1, 8], "dtype": "float32"}], "outputs": ["logits"]}
    record = {"zoo_export_version": 1, "format": "paddle", "precision": precision, "model": "AttentionLSTM",
              **spec, "programs": {"model": {"method": None, **spec}}}
    (tmp_path / "infer_cfg.yml").write_text(yaml.safe_dump(record))
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "model.pdiparams").write_bytes(b"")
    return str(tmp_path)


@pytest.mark.parametrize("precision, card", [("fp32", "0"), ("fp16", "3"), ("bf16", "1,5")])
def test_gpu_inference_runs_on_this_processs_card_in_the_asked_precision(tmp_path, monkeypatch, precision, card):
    import paddle.inference as pi
    from deploy import predictor
    _RecordingConfig.calls = []
    monkeypatch.setattr(predictor.pi, "Config", _RecordingConfig)
    monkeypatch.setattr(predictor.pi, "create_predictor", lambda config: _FakePredictor(["x"]))
    monkeypatch.setenv("FLAGS_selected_gpus", card)
    monkeypatch.setenv("PADDLE_LOCAL_RANK", "1")
    p = predictor.Predictor(_fake_export(tmp_path), device="gpu", precision=precision)
    assert p.precision == precision
    want = {"fp32": pi.PrecisionType.Float32, "fp16": pi.PrecisionType.Half, "bf16": pi.PrecisionType.Bfloat16}
    card_id = {"0": 0, "3": 3, "1,5": 5}[card]   # a list is indexed by the local rank (1)
    assert ("enable_use_gpu", (256, card_id, want[precision])) in _RecordingConfig.calls, _RecordingConfig.calls
    assert not any(name in ("enable_mkldnn", "enable_mkldnn_bfloat16") for name, _ in _RecordingConfig.calls)


def test_fp16_inference_on_a_cpu_is_one_line(tmp_path):
    from deploy import predictor
    from engine.errors import ConfigError
    with pytest.raises(ConfigError, match="fp16 runs on a GPU"):
        predictor.Predictor(_fake_export(tmp_path), device="cpu", precision="fp16")


# ------------------------------------------------------------------------------ no host round trips
def test_the_transformers_training_forward_reads_nothing_back_to_the_host(monkeypatch):
    """The source-length check reads the lengths only when the padded width exceeds the position table
    (no source is longer than its batch's width), and the sample index only for that message."""
    from engine.errors import ConfigError
    from tests.helpers import peaked_transformer
    model, src = peaked_transformer()   # max_length 30
    model.train()
    reads = []
    original = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy", lambda self, *a, **k: reads.append(self.shape) or original(self))
    batch = {"src_ids": paddle.to_tensor(src), "tgt_in": paddle.to_tensor(src), "tgt_out": paddle.to_tensor(src),
             "index": paddle.to_tensor(np.arange(6))}
    out = model(batch)
    out["loss"].backward()
    assert reads == []
    wide = np.full((6, 33), 3)
    wide[:, -1] = 1
    wide[2, 31:] = [1, 0]   # sample 2: 32 tokens with <e>; the others 33
    batch = {"src_ids": paddle.to_tensor(wide), "index": paddle.to_tensor(np.arange(10, 16))}
    with pytest.raises(ConfigError, match=r"source of sample 10 has 33 tokens"):
        model(batch)
