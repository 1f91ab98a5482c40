"""Parameters and multiply-adds (MACs) of a recipe's model at the recipe's input shape, by module,
without training: what tools/analyze.py prints (docs/tools.md, "analyze").

Why here: this is measuring code, and benchmarks/ is the floor for it (docs/contributing.md, "The layout:
folders as floors"). It needs the engine (config, registry, builder) and ops/ (the fused operators it
counts), which this floor may import, and it names the models, whose batches it makes: code under
engine/ may name no component (tests/test_layout.py), so it cannot live there.

**What is counted.** One multiply-add (MAC) per product of a convolution, a linear layer or a matrix
product; FLOPs = 2 x MACs (one multiply, one add). The count is taken during one real forward pass in
evaluation mode under `paddle.no_grad()` on a dummy batch of the recipe's shape, at the level where the
arithmetic happens: the models call our operators (ops/layers.py, ops/functional.py) rather than their
layers' own forward, so a hook on nn.Conv2D / nn.Linear alone would miss most of it. During the pass
the operator functions and paddle's (paddle.matmul / bmm, paddle.nn.functional linear, conv and
transposed conv, scaled_dot_product_attention, the RNN layers) are wrapped, and restored afterwards;
only the outermost counted call counts (ops.linear's GEMM, or the reference path's paddle.matmul inside
it, is counted once), so the figures are the same on the fused and on the reference path.

- convolution: N x Cout x Hout x Wout (x Dout) x Cin/groups x kh x kw (x kd), the output's size times
  the kernel's (the bias is an addition: not counted);
- transposed convolution: N x Cin x Hin x Win x Cout/groups x kh x kw (each input pixel scatters its
  kernel);
- linear / matmul: M x K x N for [M, K] @ [K, N] (batched: times the batch); attention: its two
  batched products, q k^T and p v (2 x B x heads x S x T x d);
- LSTM / GRU / RNN: per sample and time step, each direction's and layer's (input + hidden) x gates x H
  (the sizes of its weight_ih and weight_hh), over the padded steps the kernel runs.

Not counted (stated in the output): element-wise operations and activations, the bias additions,
normalisation (BatchNorm, LayerNorm), softmax, pooling, interpolation, RoIAlign, embedding look-ups,
losses, and the models' Python around the networks (proposals, NMS, mask pasting, beam search).

Each count goes to the module doing it: the layer whose weight it uses (ops.linear(x, self.fc1) counts
under `fc1`) when that layer lies inside the innermost nn.Layer being executed, else that innermost
layer (a stack kept by forward pre/post hooks): attention's products count under the attention layer,
a tied output projection under the head that calls it.

**The input shape** is each model's dummy batch with named sizes read from the recipe (`INPUTS`): the
evaluation reader's segments and crop for the clip models, the training crop for segmentation (the
evaluation images have no fixed size), the reader's padded length for BERT (max_seq_length,
max_predictions_per_seq) and its longest video for the YouTube-8M models (max_frames; Attention Cluster's
sampled frames), a pair of 32-subword sentences for the Transformer (its reader's max_len is a filter,
not a length), the evaluation resize of the detector with the long side at its limit. Batch 1.
`--input-shape name=value` changes any of them. The Transformer's eval forward decodes by beam search,
whose length depends on the weights: it is counted teacher-forced (the training forward, no gradients).
Mask R-CNN's heads run on what the RPN and the detector keep: the count lowers score_thresh to 0 so that
they run at the recipe's limits (test_post_nms_top_n proposals, max_per_image detections).
"""
import collections
import dataclasses
import functools
import glob
import math
import os

import numpy as np
import paddle
import paddle.nn.functional as F

import ops
from engine import builder, config
from engine.components import load_all
from engine.errors import ConfigError, did_you_mean
from ops import functional as fn
from ops import layers as op_layers
from ops.paddle_attrs import batch_norm_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `tools/analyze.py --all --json`: counts from the code, no machine in them, so a record of the recipes (beside
# them) that the model-zoo page reads, not a benchmark result
JSON = os.path.join(ROOT, "configs", "macs.json")

COUNTED = ("convolutions, transposed convolutions, linear layers and matrix products (attention's two batched "
           "products), LSTM/GRU/RNN cells")
NOT_COUNTED = ("element-wise operations and activations, bias additions, normalisation (BatchNorm, LayerNorm), "
               "softmax, pooling, interpolation, RoIAlign, embedding look-ups, losses, and the Python around "
               "the networks (proposals, NMS, mask pasting, beam search)")


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _arg(args, kwargs, i, *names, default=None):
    """The call's argument number `i` or by one of `names` (paddle 3 also takes torch-style aliases)."""
    if len(args) > i:
        return args[i]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return default


# ------------------------------------------------------------------------------ what one call costs
# Each returns [(layer or weight the count belongs to, or None, kind, MACs)] from the call's output and arguments.
def _matmul_macs(out, args, kwargs):
    x = _arg(args, kwargs, 0, "x", "input")
    transpose_x = _arg(args, kwargs, 2, "transpose_x", default=False)
    k = x.shape[0] if x.ndim == 1 else x.shape[-2] if transpose_x else x.shape[-1]
    y = _arg(args, kwargs, 1, "y", "other", "mat2")
    return [(y, "matmul", _numel(out.shape) * int(k))]


def _functional_linear_macs(out, args, kwargs):        # F.linear(x, weight [in, out], bias) / fn.linear
    weight = _arg(args, kwargs, 1, "weight")
    return [(weight, "linear", _numel(out.shape) * int(weight.shape[0]))]


def _layers_linear_macs(out, args, kwargs):            # ops.linear(x, layer or [layers]): one GEMM per layer
    x, layers = _arg(args, kwargs, 0, "x"), _arg(args, kwargs, 1, "layers")
    layers = layers if isinstance(layers, (list, tuple)) else [layers]
    rows = _numel(x.shape[:-1])
    return [(m, "linear", rows * _numel(m.weight.shape)) for m in layers]


def _linear_add_norm_macs(out, args, kwargs):          # ops.linear_add_norm(x, linear_layer, ...)
    x, layer = _arg(args, kwargs, 0, "x"), _arg(args, kwargs, 1, "linear_layer")
    return [(layer, "linear", _numel(x.shape[:-1]) * _numel(layer.weight.shape))]


def _conv_macs(out, weight, layer=None):
    return [(layer if layer is not None else weight, "conv", _numel(out.shape) * _numel(weight.shape[1:]))]


def _layer_conv_macs(out, args, kwargs):               # ops.conv2d / ops.conv_bn_act / fn.conv2d (x, conv, ...)
    conv = _arg(args, kwargs, 1, "conv")
    return _conv_macs(out, conv.weight, conv)


def _functional_conv_macs(out, args, kwargs):          # F.conv1d/2d/3d, F.conv._conv_nd (x, weight, ...)
    return _conv_macs(out, _arg(args, kwargs, 1, "weight"))


def _transpose_macs(x, weight, layer=None):            # weight [Cin, Cout/groups, *k]
    return [(layer if layer is not None else weight, "conv_transpose", _numel(x.shape) * _numel(weight.shape[1:]))]


def _layer_transpose_macs(out, args, kwargs):          # ops.conv_transpose / fn.conv_transpose (x, deconv)
    deconv = _arg(args, kwargs, 1, "deconv")
    return _transpose_macs(_arg(args, kwargs, 0, "x"), deconv.weight, deconv)


def _functional_transpose_macs(out, args, kwargs):     # F.conv2d_transpose (x, weight, ...)
    return _transpose_macs(_arg(args, kwargs, 0, "x"), _arg(args, kwargs, 1, "weight"))


def _attention_macs(out, args, kwargs):                # ops.attention(q [B, H, S, d], k [B, H, T, d], v, ...)
    q, k = _arg(args, kwargs, 0, "q"), _arg(args, kwargs, 1, "k")
    return [(None, "attention", 2 * _numel(q.shape) * int(k.shape[-2]))]


def _sdpa_macs(out, args, kwargs):                     # F.scaled_dot_product_attention(q [B, S, H, d], k [B, T, H, d], ...)
    q, k = _arg(args, kwargs, 0, "query"), _arg(args, kwargs, 1, "key")
    return [(None, "attention", 2 * _numel(q.shape) * int(k.shape[1]))]


def _rnn_steps_macs(rnn, x):
    """Per sample and step, the products of every layer's and direction's input and hidden weights."""
    weights = {id(p): p for name, p in rnn.named_parameters() if "weight_ih" in name or "weight_hh" in name}
    per_step = sum(_numel(p.shape) for p in weights.values())
    time_major = bool(getattr(rnn, "time_major", False))
    steps = x.shape[0] if time_major else x.shape[1]
    batch = x.shape[1] if time_major else x.shape[0]
    return [(rnn, "rnn", int(batch) * int(steps) * per_step)]


def _layer_lstm_macs(out, args, kwargs):               # ops.lstm / fn.lstm (x, rnn, lengths)
    return _rnn_steps_macs(_arg(args, kwargs, 1, "rnn"), _arg(args, kwargs, 0, "x"))


def _rnn_forward_macs(out, args, kwargs):              # RNNBase.forward(self, inputs, ...)
    return _rnn_steps_macs(args[0], _arg(args, kwargs, 1, "inputs"))


# (object, attribute, cost): the functions wrapped during a counting pass. Models call `ops.X` (the package's
# names), ops.layers calls `fn.X`, the references and paddle's layers call paddle's functions: each is
# wrapped where it is looked up. Only the outermost counted call of a nesting counts.
def _targets():
    rnn_base = paddle.nn.layer.rnn.RNNBase
    conv_module = paddle.nn.functional.conv
    targets = []
    for where in (ops, op_layers):
        targets += [(where, "linear", _layers_linear_macs), (where, "linear_add_norm", _linear_add_norm_macs),
                    (where, "matmul", _matmul_macs), (where, "attention", _attention_macs),
                    (where, "conv2d", _layer_conv_macs), (where, "conv_bn_act", _layer_conv_macs),
                    (where, "conv_transpose", _layer_transpose_macs), (where, "lstm", _layer_lstm_macs)]
    targets += [(fn, "matmul", _matmul_macs), (fn, "linear", _functional_linear_macs),
                (fn, "conv2d", _layer_conv_macs), (fn, "conv_transpose", _layer_transpose_macs),
                (fn, "lstm", _layer_lstm_macs),
                (paddle, "matmul", _matmul_macs), (paddle, "bmm", _matmul_macs), (paddle, "mm", _matmul_macs),
                (F, "linear", _functional_linear_macs), (F, "scaled_dot_product_attention", _sdpa_macs),
                (conv_module, "_conv_nd", _functional_conv_macs), (rnn_base, "forward", _rnn_forward_macs)]
    for name in ("conv1d", "conv2d", "conv3d"):
        targets += [(F, name, _functional_conv_macs), (conv_module, name, _functional_conv_macs)]
    for name in ("conv1d_transpose", "conv2d_transpose", "conv3d_transpose"):
        targets += [(F, name, _functional_transpose_macs), (conv_module, name, _functional_transpose_macs)]
    return [(obj, attr, cost) for obj, attr, cost in targets if hasattr(obj, attr)]


class MacCounter:
    """`with MacCounter(model) as c: model(batch)`: c.by_module {layer name: MACs} ("" the model itself),
    c.by_op {kind: MACs}, c.total. Wraps the functions of `_targets()` and hooks every sublayer of
    `model` for the duration of the block only."""

    def __init__(self, model):
        self.model = model
        self.names = {id(layer): name for name, layer in model.named_sublayers(include_self=True)}
        self.owner = {}
        for name, layer in model.named_sublayers(include_self=True):
            for p in layer.parameters(include_sublayers=False):
                self.owner.setdefault(id(p), name)
        self.by_module, self.by_op = collections.Counter(), collections.Counter()
        self._stack, self._inside, self._patches, self._hooks = [], 0, [], []

    @property
    def total(self):
        return sum(self.by_op.values())

    def _where(self, thing):
        """The module a count belongs to: `thing`'s layer (a layer, or the layer owning a weight) when it
        lies inside the innermost layer running, else that innermost layer."""
        running = self._stack[-1] if self._stack else ""
        name = self.names.get(id(thing)) if thing is not None else None
        if name is None and thing is not None:
            name = self.owner.get(id(thing))
        if name is not None and (running == "" or name == running or name.startswith(running + ".")):
            return name
        return running

    def _wrap(self, original, cost):
        counter = self

        @functools.wraps(original)
        def counted(*args, **kwargs):
            if counter._inside:           # inside a counted call: its own arithmetic, counted by the outer one
                return original(*args, **kwargs)
            counter._inside += 1
            try:
                out = original(*args, **kwargs)
            finally:
                counter._inside -= 1
            first = out[0] if isinstance(out, (list, tuple)) else out
            for thing, kind, macs in cost(first, args, kwargs):
                counter.by_module[counter._where(thing)] += int(macs)
                counter.by_op[kind] += int(macs)
            return out
        return counted

    def __enter__(self):
        for obj, attr, cost in _targets():
            original = getattr(obj, attr)
            self._patches.append((obj, attr, original))
            setattr(obj, attr, self._wrap(original, cost))
        for name, layer in self.model.named_sublayers(include_self=True):
            self._hooks.append(layer.register_forward_pre_hook(functools.partial(self._enter_layer, name)))
            self._hooks.append(layer.register_forward_post_hook(functools.partial(self._leave_layer, name)))
        return self

    def _enter_layer(self, name, layer, inputs):
        self._stack.append(name)

    def _leave_layer(self, name, layer, inputs, outputs):
        if self._stack and self._stack[-1] == name:
            self._stack.pop()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        for obj, attr, original in reversed(self._patches):
            setattr(obj, attr, original)
        self._hooks, self._patches, self._stack = [], [], []
        return False


def count_macs(model, inputs, run=None, training=False):
    """(total MACs, MacCounter) of one forward of `model` on `inputs` (a batch dict, or a tensor for a
    bare network) under paddle.no_grad(), in eval mode unless `training`; `run(model, inputs)` replaces
    the call `model(inputs)`. The model's mode is restored."""
    was_training = model.training
    model.train() if training else model.eval()
    try:
        with paddle.no_grad(), MacCounter(model) as counter:
            (run or (lambda m, x: m(x)))(model, inputs)
    finally:
        model.train() if was_training else model.eval()
    return counter.total, counter


def params_by_module(model):
    """{layer name: trainable parameters of the layer itself} ("" the model), each tensor once (tied
    weights count where they first appear), with engine.builder.count_params's rule."""
    out, seen = collections.Counter(), set()
    for name, layer in model.named_sublayers(include_self=True):
        for p in layer.parameters(include_sublayers=False):
            if id(p) not in seen:
                seen.add(id(p))
                if not p.stop_gradient:
                    out[name] += _numel(p.shape)
    return out


def all_params(model):
    """Every parameter, frozen ones too, each tensor once; BatchNorm's running statistics (paddle keeps them
    as parameters that take no gradient) are not counted."""
    stats = set()
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, paddle.nn.layer.norm._BatchNormBase):
            s = batch_norm_settings(layer)
            stats.update((id(s.mean), id(s.variance)))
    return sum(_numel(p.shape) for p in {id(p): p for p in model.parameters()}.values() if id(p) not in stats)


def lazy_params(model_cfg):
    """Trainable parameters of the model built under paddle.LazyGuard (shapes only, no weights allocated):
    the full size of any model at no memory cost."""
    with paddle.LazyGuard():
        return builder.count_params(builder.build_model(model_cfg))


def subtree(counts, depth):
    """{module name cut to `depth` dotted parts: sum of `counts` under it} plus every ancestor's total;
    "" is the model (depth 0)."""
    out = collections.Counter()
    for name, value in counts.items():
        parts = name.split(".") if name else []
        for d in range(0, min(len(parts), depth) + 1):
            out[".".join(parts[:d])] += value
    return out


# ------------------------------------------------------------------------------ the recipes' batches
@dataclasses.dataclass
class Inputs:
    """A model's dummy batch: named sizes (`dims`, with where each came from in `sources`), `make(model,
    dims) -> batch`, `describe(dims) -> short text`, the forward mode and the config overrides the count
    runs with."""
    dims: dict
    sources: dict
    make: object
    describe: object
    training: bool = False
    overrides: tuple = ()
    note: str = ""


def _splits(cfg, order):
    reader = cfg.get("reader") or {}
    return [(s, reader[s]) for s in order if isinstance(reader.get(s), dict)]


def _reader_value(cfg, key, order=("val", "train")):
    for split, section in _splits(cfg, order):
        if section.get(key) is not None:
            return section[key], f"reader.{split}.{key}"
    return None, None


CROPS = {"CenterCrop": "size", "RandomCrop": "size", "MultiScaleCrop": "size", "TenCrop": "size",
         "ThreeCrop": "size", "RandomPaddingCrop": "crop_size"}


def _crop(cfg, order):
    """((height, width), source) of the first crop transform of the first split of `order` that has one."""
    for split, section in _splits(cfg, order):
        for t in section.get("transforms") or []:
            if isinstance(t, dict) and t.get("name") in CROPS:
                key = CROPS[t["name"]]
                size = t.get(key, 224 if key == "size" else [512, 512])
                if isinstance(size, (list, tuple)):   # RandomPaddingCrop: [width, height]
                    return (int(size[1]), int(size[0])), f"reader.{split} {t['name']} {key}"
                return (int(size), int(size)), f"reader.{split} {t['name']} {key}"
    return None, None


def _spec_inputs(model):
    try:
        return model.export_spec(None)["inputs"]
    except ConfigError:
        return {}


def _rng():
    return np.random.default_rng(0)


def _tensor(array):
    return paddle.to_tensor(array)


def _one():
    return {"batch": 1}, {"batch": "one sample"}


def _clips(cfg):
    dims, sources = _one()
    dims["segments"], sources["segments"] = _reader_value(cfg, "num_seg")
    if dims["segments"] is None:
        dims["segments"], sources["segments"] = 3, "default"
    (dims["height"], dims["width"]), where = _crop(cfg, ("val", "train"))
    sources["height"] = sources["width"] = where

    def make(model, d):   # [B, V=1, T, C, H, W]: one view, so no num_views reshaping
        channels = _spec_inputs(model)["imgs"].shape[-3]
        shape = [d["batch"], 1, d["segments"], channels, d["height"], d["width"]]
        return {"imgs": _tensor(_rng().standard_normal(shape, np.float32))}
    return Inputs(dims, sources, make, lambda d: f"{d['segments']} seg x {d['height']}x{d['width']}")


def _images(default_source):
    def spec(cfg, order=("train", "val")):
        dims, sources = _one()
        size, where = _crop(cfg, order)
        if size is None:
            size, where = (224, 224), default_source
        (dims["height"], dims["width"]), sources["height"], sources["width"] = size, where, where

        def make(model, d):
            spec_image = _spec_inputs(model).get("image")
            channels = spec_image.shape[1] if spec_image is not None else int(cfg["model"].get("in_channels", 3))
            return {"image": _tensor(_rng().standard_normal([d["batch"], channels, d["height"], d["width"]],
                                                            np.float32))}
        return Inputs(dims, sources, make, lambda d: f"{d['height']}x{d['width']}")
    return spec


def _resnet(cfg):
    inputs = _images("default: ImageNet's 224")(cfg)
    inner = inputs.make
    inputs.make = lambda model, d: inner(model, d)["image"]   # a bare network: model(x)
    return inputs


def _mask_rcnn(cfg):
    dims, sources = _one()
    for split, section in _splits(cfg, ("val", "train")):
        resize = [t for t in section.get("transforms") or [] if isinstance(t, dict) and t.get("name") == "ResizeShort"]
        if resize:
            short = resize[0].get("short_sizes", [800])
            short = max(short) if isinstance(short, (list, tuple)) else short
            divisor = int((section.get("collate") or {}).get("size_divisor", 1) or 1)
            up = lambda v: int(math.ceil(v / divisor) * divisor)   # noqa: E731  (PadImages' size_divisor)
            dims["height"], dims["width"] = up(short), up(resize[0].get("max_size", 1333))
            sources["height"] = sources["width"] = (f"reader.{split} ResizeShort {short} / max_size "
                                                    f"{resize[0].get('max_size', 1333)}, the long side at its limit, "
                                                    f"padded to {divisor}")
            break
    else:
        dims["height"], dims["width"] = 800, 1344
        sources["height"] = sources["width"] = "default"

    def make(model, d):
        image = _rng().standard_normal([d["batch"], 3, d["height"], d["width"]], np.float32)
        return {"image": _tensor(image),
                "image_size": _tensor(np.tile(np.array([[d["height"], d["width"]]], np.int64), (d["batch"], 1)))}
    return Inputs(dims, sources, make, lambda d: f"{d['height']}x{d['width']}",
                  overrides=("model.test.score_thresh=0.0",),
                  note="heads at their limits: model.test.score_thresh=0 keeps max_per_image detections")


def _bert(pretraining):
    def spec(cfg):
        dims, sources = _one()
        dims["seq_len"], sources["seq_len"] = _reader_value(cfg, "max_seq_length")
        if dims["seq_len"] is None:
            dims["seq_len"], sources["seq_len"] = 128, "default"
        if pretraining:
            dims["masked"], sources["masked"] = _reader_value(cfg, "max_predictions_per_seq")
            if dims["masked"] is None:
                dims["masked"], sources["masked"] = 20, "default"

        def make(model, d):
            rng, b, s = _rng(), d["batch"], d["seq_len"]
            batch = {"input_ids": _tensor(rng.integers(5, 100, (b, s)).astype(np.int64)),
                     "token_type_ids": _tensor((np.arange(s)[None] >= s // 2).repeat(b, 0).astype(np.int64)),
                     "input_ids_mask": _tensor(np.ones((b, s), np.float32))}
            if pretraining:
                p = d["masked"]
                positions = np.stack([np.sort(rng.choice(np.arange(1, max(s - 1, p + 1)), p, replace=False))
                                      for _ in range(b)])
                batch.update(masked_lm_positions=_tensor(positions.astype(np.int64)),
                             masked_lm_ids=_tensor(rng.integers(5, 100, (b, p)).astype(np.int64)))
            return batch
        describe = (lambda d: f"seq {d['seq_len']}, {d['masked']} masked") if pretraining else \
            (lambda d: f"seq {d['seq_len']}")
        return Inputs(dims, sources, make, describe)
    return spec


SENTENCE = 32


def _transformer(cfg):
    dims, sources = _one()
    # max_len is a filter (256, 1024 for big), not a sentence: a pair of 32 subwords each, the padded length
    # benchmarks/peers.py times, at most the reader's max_len
    limit, where = _reader_value(cfg, "max_len", ("train", "val"))
    length = min(SENTENCE, int(limit)) if limit else SENTENCE
    source = f"default: a sentence of {SENTENCE} subwords" + (f", at most {where}" if limit else "")
    dims.update(src_len=length, tgt_len=length)
    sources.update(src_len=source, tgt_len=source)

    def make(model, d):
        rng, b = _rng(), d["batch"]
        src = rng.integers(5, 100, (b, d["src_len"])).astype(np.int64)
        tgt = rng.integers(5, 100, (b, d["tgt_len"])).astype(np.int64)
        tgt_in = np.concatenate([np.zeros((b, 1), np.int64), tgt[:, :-1]], 1)   # <s> = 0
        ones = lambda n: _tensor(np.ones((b, n), np.float32))   # noqa: E731
        return {"src_ids": _tensor(src), "src_ids_mask": ones(d["src_len"]), "tgt_in": _tensor(tgt_in),
                "tgt_out": _tensor(tgt), "tgt_in_mask": ones(d["tgt_len"]), "tgt_out_mask": ones(d["tgt_len"])}
    return Inputs(dims, sources, make, lambda d: f"src {d['src_len']} + tgt {d['tgt_len']} tokens", training=True,
                  note="teacher-forced (the training forward without gradients): the eval forward's beam search "
                       "runs as long as the weights make it")


def _features(fixed_frames):
    def spec(cfg):
        dims, sources = _one()
        if fixed_frames:
            frames, where = None, None
            for split, section in _splits(cfg, ("val", "train")):
                for t in section.get("transforms") or []:
                    if isinstance(t, dict) and t.get("name") == "SampleFrames":
                        frames, where = t.get("num_frames"), f"reader.{split} SampleFrames num_frames"
                        break
                if frames:
                    break
            if frames is None:
                frames, where = cfg["model"].get("seg_num", 100), "model.seg_num"
        else:
            frames, where = _reader_value(cfg, "max_frames")
            if frames is None:
                frames, where = 300, "default"
            where += " (the longest video the reader reads)"
        dims["frames"], sources["frames"] = int(frames), where

        def make(model, d):
            rng = _rng()
            return {name: _tensor(rng.standard_normal([d["batch"], d["frames"], s.shape[-1]], np.float32))
                    for name, s in _spec_inputs(model).items() if len(s.shape) == 3}
        return Inputs(dims, sources, make, lambda d: f"{d['frames']} frames")
    return spec


# registry name -> the batch of its recipes (benchmarks/peers.py make_batch holds the training batches)
INPUTS = {
    "TSN": _clips, "StNet": _clips,
    "DeepLabV3": _images("default"), "ResNet": _resnet, "MaskRCNN": _mask_rcnn,
    "BertForPretraining": _bert(True), "BertForSequenceClassification": _bert(False),
    "Transformer": _transformer,
    "AttentionCluster": _features(True), "NeXtVLAD": _features(False), "AttentionLSTM": _features(False),
}


def parse_shape(texts):
    """{name: int} from `--input-shape` words: NAME=VALUE, several per word separated by commas;
    `size=N` sets height and width. A word that does not parse is a ConfigError."""
    out = {}
    for text in texts or ():
        for item in str(text).split(","):
            if not item.strip():
                continue
            name, sep, value = item.partition("=")
            name = name.strip()
            try:
                number = int(value.strip())
            except ValueError:
                number = None
            if not sep or not name or number is None or number < 1:
                raise ConfigError(f"--input-shape: '{item}' is not NAME=N with N a positive integer "
                                  f"(e.g. --input-shape batch=2 segments=8 size=256)")
            if name == "size":
                out.update(height=number, width=number)
            else:
                out[name] = number
    return out


def recipe_inputs(cfg, shape=None):
    """The Inputs of a loaded recipe's model with `shape` ({name: int}) applied."""
    name = cfg["model"]["name"]
    if name not in INPUTS:
        raise ConfigError(f"analyze: no dummy batch is known for model '{name}' (benchmarks/flops.py INPUTS "
                          f"has {', '.join(sorted(INPUTS))})")
    inputs = INPUTS[name](cfg)
    for key, value in (shape or {}).items():
        if key not in inputs.dims:
            raise ConfigError(f"--input-shape: {name} has no size '{key}'{did_you_mean(key, inputs.dims)}; "
                              f"its sizes: {', '.join(inputs.dims)}" + (" (size= sets height and width)"
                                                                         if "height" in inputs.dims else ""))
        inputs.dims[key], inputs.sources[key] = value, "--input-shape"
    return inputs


def _shapes(batch):
    items = batch.items() if isinstance(batch, dict) else [("x", batch)]
    return {k: [int(s) for s in v.shape] for k, v in items if isinstance(v, paddle.Tensor)}


def analyze_config(cfg, name, shape=None, depth=2, macs=True, inputs=None):
    """The analysis of a loaded recipe `cfg` (`name`: its file, for the record) as plain data: parameters
    (exact, and under LazyGuard), MACs by operator kind and by module (to `depth`), the input and where
    its sizes come from. `macs=False`: parameters only, the model built under LazyGuard (no weights
    allocated, no forward). `inputs`: recipe_inputs(cfg, shape) when the caller has it."""
    load_all()
    inputs = inputs or recipe_inputs(cfg, shape)
    result = {"config": name, "model": cfg["model"]["name"], "unit": "MACs (multiply-adds); FLOPs = 2 x MACs",
              "input": {"dims": dict(inputs.dims), "sources": dict(inputs.sources),
                        "text": inputs.describe(inputs.dims),
                        "mode": "train (no gradients)" if inputs.training else "eval"},
              "counted": COUNTED, "not_counted": NOT_COUNTED,
              "params": {"trainable_lazy": lazy_params(cfg["model"])}}
    if inputs.note:
        result["input"]["note"] = inputs.note
    if not macs:
        with paddle.LazyGuard():
            model = builder.build_model(cfg["model"])
        by_params = params_by_module(model)
        result["params"].update(trainable=sum(by_params.values()), all=all_params(model))
        result["modules"] = _modules(model, by_params, collections.Counter(), depth)
        return result
    paddle.seed(0)   # the same weights each time: Mask R-CNN's heads run on what its random RPN keeps
    model = builder.build_model(cfg["model"])
    batch = inputs.make(model, inputs.dims)
    total, counter = count_macs(model, batch, training=inputs.training)
    by_params = params_by_module(model)
    result["input"]["shapes"] = _shapes(batch)
    result["params"].update(trainable=sum(by_params.values()), all=all_params(model))
    result.update(macs=int(total), flops=2 * int(total), macs_by_op=dict(counter.by_op.most_common()),
                  modules=_modules(model, by_params, counter.by_module, depth))
    return result


def _modules(model, by_params, by_macs, depth):
    """[{name, type, params, macs}] of the model and its modules to `depth` in the model's order, those
    with parameters or MACs only."""
    params, macs = subtree(by_params, depth), subtree(by_macs, depth)
    rows = []
    for name, layer in model.named_sublayers(include_self=True):
        if (name.count(".") + 1 if name else 0) > depth or not (params.get(name) or macs.get(name)):
            continue
        rows.append({"name": name, "type": type(layer).__name__, "params": int(params.get(name, 0)),
                     "macs": int(macs.get(name, 0))})
    return rows


def analyze(path, overrides=(), shape=None, depth=2, macs=True):
    """analyze_config of the recipe file `path` with `-o` overrides (after the count's own, so they win)."""
    if not os.path.isfile(str(path)):
        raise ConfigError(f"-c {path}: no such recipe file (python tools/list_models.py lists them)")
    load_all()
    cfg = config.load(path, list(overrides))
    inputs = recipe_inputs(cfg, shape)
    if macs and inputs.overrides:
        cfg = config.load(path, list(inputs.overrides) + list(overrides))
    return analyze_config(cfg, _rel(path), shape, depth, macs, inputs)


def _rel(path):
    full = os.path.abspath(path)
    return (os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else str(path)).replace(os.sep, "/")


def recipes():
    """Every recipe file under configs/ (the _base_ pieces aside), sorted."""
    paths = glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
    return sorted(p for p in paths if "_base_" not in p.split(os.sep))


# ------------------------------------------------------------------------------ text
def human(n, unit=""):
    """1234567 -> '1.23 M'."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n} {unit}".rstrip()


def report(result):
    """The printed analysis: header lines, then the per-module table."""
    p, inp = result["params"], result["input"]
    lines = [f"{result['config']}: {result['model']}"]
    sizes = "; ".join(f"{k} {v} ({inp['sources'][k]})" for k, v in inp["dims"].items())
    lines.append(f"input ({inp['mode']} forward): {sizes}")
    if inp.get("shapes"):
        lines.append("  batch: " + ", ".join(f"{k} {v}" for k, v in inp["shapes"].items()))
    if inp.get("note"):
        lines.append(f"  note: {inp['note']}")
    frozen = p["all"] - p["trainable"]
    lines.append(f"parameters: {p['trainable']:,} trainable ({human(p['trainable'])})"
                 + (f", {frozen:,} frozen" if frozen else "")
                 + f"; built under paddle.LazyGuard: {p['trainable_lazy']:,}")
    if "macs" in result:
        lines.append(f"MACs: {result['macs']:,} ({human(result['macs'])}) multiply-adds in one forward; "
                     f"FLOPs = 2 x MACs = {human(result['flops'])}")
        lines.append("  by operator: " + ", ".join(f"{k} {human(v)}" for k, v in result["macs_by_op"].items()))
        lines.append(f"  counted: {result['counted']}")
        lines.append(f"  not counted: {result['not_counted']}")
    rows = result["modules"]
    name_w = max([len("module")] + [2 * (r["name"].count(".") + 1 if r["name"] else 0) + len(r["name"] or result["model"])
                                    for r in rows])
    type_w = max([len("type")] + [len(r["type"]) for r in rows])
    head = f"{'module':<{name_w}}  {'type':<{type_w}}  {'params':>10}"
    has_macs = "macs" in result
    if has_macs:
        head += f"  {'MACs':>10}  {'share':>6}"
    lines += ["", head]
    for r in rows:
        level = r["name"].count(".") + 1 if r["name"] else 0
        line = f"{'  ' * level + (r['name'] or result['model']):<{name_w}}  {r['type']:<{type_w}}  {human(r['params']):>10}"
        if has_macs:
            share = 100.0 * r["macs"] / result["macs"] if result["macs"] else 0.0
            line += f"  {human(r['macs']):>10}  {share:5.1f}%"
        lines.append(line)
    return "\n".join(lines)


def summary_line(result):
    return (f"{result['config']:<72} {result['model']:<30} {human(result['params']['trainable']):>10} "
            f"{human(result.get('macs', 0)):>10}  {result['input']['text']}")


def table_entry(result):
    """What docs/model-zoo.md's table reads of a recipe (configs/macs.json)."""
    return {"model": result["model"], "params": result["params"]["trainable"], "macs": result["macs"],
            "input": result["input"]["text"], "mode": result["input"]["mode"], "macs_by_op": result["macs_by_op"]}
