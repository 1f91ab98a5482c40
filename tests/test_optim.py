"""LR schedules (hand-computed values), no-decay parameter groups, RMSProp centered, gradient clipping."""
import inspect
import math

import numpy as np
import paddle
import pytest

from engine.errors import ConfigError
from engine.registry import LR_SCHEDULES, OPTIMIZERS
from engine.training.optim import build_lr, build_optimizer, clip_grad_norm_, split_decay


def lrs(cfg, steps, steps_per_epoch=10, epochs=10, base_lr=None):
    sched = build_lr(cfg, steps_per_epoch, steps_per_epoch * epochs, base_lr)
    return [sched.lr_at(t) for t in steps]


# ----------------------------------------------------------------------------- schedules

def test_constant_with_linear_warmup_steps():
    # ramp from 0 at t=0 to 0.1 at t=4: 0.1 * t / 4
    got = lrs({"name": "Constant", "learning_rate": 0.1, "warmup_steps": 4}, [0, 1, 2, 4, 100])
    assert got == pytest.approx([0.0, 0.025, 0.05, 0.1, 0.1])


def test_warmup_epochs_are_converted_and_start_lr():
    # warmup_epochs 0.5 at 10 steps/epoch = 5 steps; from 0.05: 0.05 + (0.1 - 0.05) * t / 5
    got = lrs({"name": "Constant", "learning_rate": 0.1, "warmup_epochs": 0.5, "warmup_start_lr": 0.05},
              [0, 1, 4, 5])
    assert got == pytest.approx([0.05, 0.06, 0.09, 0.1])


def test_piecewise_values_by_epoch_attention_lstm():
    # PaddleVideo AttentionLSTM: boundaries [5, 8] epochs, 10 steps/epoch -> steps 50 and 80
    cfg = {"name": "Piecewise", "boundaries": [5, 8], "values": [0.00025, 2.5e-5, 2.5e-6], "by": "epoch"}
    got = lrs(cfg, [0, 49, 50, 79, 80, 99])
    assert got == pytest.approx([2.5e-4, 2.5e-4, 2.5e-5, 2.5e-5, 2.5e-6, 2.5e-6])


def test_piecewise_by_step_and_gamma_multipliers():
    assert lrs({"name": "Piecewise", "boundaries": [3, 6], "values": [1.0, 0.5, 0.25], "by": "step"},
               [2, 3, 5, 6]) == pytest.approx([1.0, 0.5, 0.5, 0.25])
    # TSN Fluid: 0.01 x0.1 at epochs 15 and 30, 2 steps/epoch -> steps 30 and 60
    got = lrs({"name": "Piecewise", "learning_rate": 0.01, "boundaries": [15, 30], "gamma": 0.1},
              [29, 30, 59, 60], steps_per_epoch=2, epochs=45)
    assert got == pytest.approx([0.01, 0.001, 0.001, 0.0001])


def test_step_decay_nextvlad_and_by_epoch():
    # NeXtVLAD: 2e-4 * 0.8^floor(t / 12500)
    cfg = {"name": "StepDecay", "learning_rate": 2e-4, "step_size": 12500, "gamma": 0.8, "by": "step"}
    got = lrs(cfg, [0, 12499, 12500, 25000, 699999])
    assert got == pytest.approx([2e-4, 2e-4, 1.6e-4, 1.28e-4, 2e-4 * 0.8 ** 55])
    # step_size 2 epochs at 3 steps/epoch = 6 steps
    assert lrs({"name": "StepDecay", "learning_rate": 1.0, "step_size": 2, "gamma": 0.5}, [5, 6, 12],
               steps_per_epoch=3) == pytest.approx([1.0, 0.5, 0.25])


def test_linear_decay_starts_after_warmup():
    # 10 steps in all: no warm-up: 1 - t/10
    assert lrs({"name": "LinearDecay", "learning_rate": 1.0}, [0, 5, 10, 20], 10, 1) == \
        pytest.approx([1.0, 0.5, 0.0, 0.0])
    # warm-up 2 steps (0, 0.5), then 1 -> 0 over the remaining 8: t=6 is half way
    assert lrs({"name": "LinearDecay", "learning_rate": 1.0, "warmup_steps": 2}, [0, 1, 2, 6, 10], 10, 1) == \
        pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])


def test_polynomial_and_cosine():
    # (1.1 - 0.1) * (1 - 5/10)^2 + 0.1 = 0.35
    got = lrs({"name": "Polynomial", "learning_rate": 1.1, "power": 2.0, "end_lr": 0.1, "decay_steps": 10},
              [0, 5, 10, 50])
    assert got == pytest.approx([1.1, 0.35, 0.1, 0.1])
    # (1 + cos(pi * t / 10)) / 2: t=2 -> (1 + 0.809017) / 2
    got = lrs({"name": "Cosine", "learning_rate": 1.0}, [0, 2, 5, 10], 10, 1)
    assert got == pytest.approx([1.0, 0.9045085, 0.5, 0.0])
    assert lrs({"name": "Cosine", "learning_rate": 1.0, "eta_min": 0.2}, [5], 10, 1) == pytest.approx([0.6])


def test_noam():
    # 2 * 4^-0.5 * min(n^-0.5, n * 4^-1.5), n = t + 1
    got = lrs({"name": "Noam", "learning_rate": 2.0, "d_model": 4, "warmup_steps": 4}, [0, 3, 15])
    assert got == pytest.approx([0.125, 0.5, 0.25])


def test_base_lr_argument_overrides_and_scales_values():
    assert lrs({"name": "Cosine", "learning_rate": 1.0}, [5], 10, 1, base_lr=0.5) == pytest.approx([0.25])
    cfg = {"name": "Piecewise", "boundaries": [1], "values": [0.1, 0.01], "by": "step"}
    assert lrs(cfg, [0, 1], base_lr=0.2) == pytest.approx([0.2, 0.02])


def test_scheduler_steps_drive_the_optimizer_and_resume():
    cfg = {"name": "Piecewise", "boundaries": [2, 4], "values": [0.3, 0.2, 0.1], "by": "step"}
    sched = build_lr(cfg, 1, 10)
    opt = build_optimizer({"name": "SGD"}, paddle.nn.Linear(2, 2), sched)
    seen = []
    for _ in range(5):
        seen.append(opt.get_lr())
        sched.step()
    assert seen == pytest.approx([0.3, 0.3, 0.2, 0.2, 0.1])
    state = opt.state_dict()["LR_Scheduler"]
    again = build_lr(cfg, 1, 10)
    again.set_state_dict(state)
    assert again() == pytest.approx(0.1) and again.last_epoch == 5


def test_schedule_config_errors():
    with pytest.raises(ConfigError, match="either 'values'"):
        build_lr({"name": "Piecewise", "boundaries": [1], "values": [1.0, 0.1], "gamma": 0.1}, 1, 1)
    with pytest.raises(ConfigError, match=r"lr.values: Piecewise needs 3 values for 2 boundaries, got 2"):
        build_lr({"name": "Piecewise", "boundaries": [1, 2], "values": [1.0, 0.1]}, 1, 1)
    with pytest.raises(ConfigError, match="'by' must be 'epoch' or 'step'"):
        build_lr({"name": "StepDecay", "learning_rate": 1.0, "step_size": 1, "by": "iter"}, 1, 1)
    with pytest.raises(ConfigError, match="lr.learning_rate is required for Cosine"):
        build_lr({"name": "Cosine"}, 1, 1)
    with pytest.raises(ConfigError, match="unknown lr schedule 'Cosin'.*did you mean 'Cosine'"):
        build_lr({"name": "Cosin"}, 1, 1)


def test_signatures_are_the_config_schema():
    """The validator reads keyword names, annotations and defaults from the constructors."""
    for registry, names in ((LR_SCHEDULES, ["Constant", "Piecewise", "StepDecay", "LinearDecay",
                                            "Polynomial", "Cosine", "Noam"]),
                            (OPTIMIZERS, ["SGD", "Momentum", "Adam", "AdamW", "RMSProp"])):
        for name in names:
            params = inspect.signature(registry.get(name)).parameters.values()
            assert params and all(p.annotation is not inspect.Parameter.empty for p in params), name
    warm = inspect.signature(LR_SCHEDULES.get("Cosine")).parameters
    assert {"learning_rate", "warmup_steps", "warmup_epochs", "warmup_start_lr"} <= set(warm)


# ----------------------------------------------------------------------------- weight decay groups

class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 3)
        self.normalizer = paddle.nn.Linear(3, 3)   # "norm" in its name, but not a norm layer
        self.bn = paddle.nn.BatchNorm1D(3)
        self.post = paddle.nn.LayerNorm(3)         # a norm layer without "norm" in its name
        self.own = paddle.nn.Linear(3, 2, bias_attr=False,
                                    weight_attr=paddle.ParamAttr(regularizer=paddle.regularizer.L2Decay(0.5)))
        self.scale = self.create_parameter([2], default_initializer=paddle.nn.initializer.Constant(2.0))

    def forward(self, x):
        return self.own(self.post(self.bn(self.normalizer(self.fc(x))))) * self.scale


DECAYED = ["fc.weight", "normalizer.weight", "scale"]
EXEMPT = ["fc.bias", "normalizer.bias", "bn.weight", "bn.bias", "bn._mean", "bn._variance",
          "post.weight", "post.bias"]


def names(pairs):
    return sorted(n for n, _ in pairs)


def test_split_decay_by_layer_type_not_name():
    decay, exempt, own = split_decay(Net())
    assert names(decay) == sorted(DECAYED)
    assert names(exempt) == sorted(EXEMPT)
    assert names(own) == ["own.weight"]
    decay, exempt, _ = split_decay(Net(), no_decay=["bias", "norm", "scale"])
    assert "scale" in names(exempt)
    decay, exempt, _ = split_decay(Net(), no_decay=[])
    assert exempt == [] and "bn.weight" in names(decay)


def zero_grad_step(opt_cfg, net=None, lr=0.1):
    paddle.seed(0)
    net = net or Net()
    opt = build_optimizer(opt_cfg, net, lr)
    before = {n: p.numpy().copy() for n, p in net.named_parameters()}
    net.clear_gradients()   # an earlier step's L2 stays in its gradients (optim._L2IntoGradient)
    (net(paddle.randn([5, 4])) * 0.0).sum().backward()   # every gradient exactly 0
    opt.step()
    return net, before, {n: p.numpy() for n, p in net.named_parameters()}


@pytest.mark.parametrize("name", ["SGD", "Momentum", "AdamW"])
def test_zero_gradient_step_moves_only_decayed_params(name):
    # with g = 0 the first step is w -= lr * wd * w (L2 for SGD/Momentum, decoupled for AdamW)
    lr, wd = 0.1, 0.01
    _, before, after = zero_grad_step({"name": name, "weight_decay": wd}, lr=lr)
    for n in DECAYED:
        np.testing.assert_allclose(after[n], before[n] * (1 - lr * wd), rtol=1e-6, err_msg=n)
    for n in EXEMPT:
        if not n.startswith("bn._"):                   # running stats move with the forward pass
            np.testing.assert_array_equal(after[n], before[n], err_msg=n)
    if name != "AdamW":   # the ParamAttr L2Decay(0.5) replaces the optimizer's decay
        np.testing.assert_allclose(after["own.weight"], before["own.weight"] * (1 - lr * 0.5), rtol=1e-6)


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_l2_into_the_gradient_in_place_gives_paddles_updates(name):
    """SGD's and Adam's L2 decay, added into each gradient in place (optim._L2IntoGradient), against
    paddle's own optimizer, which adds it out of place (add_n of g and coeff * w), on the same parameter
    groups (decayed, exempt, a ParamAttr L2Decay(0.5)): equal parameters after three steps."""
    results = []
    for ours in (True, False):
        paddle.seed(0)
        net = Net()
        opt = build_optimizer({"name": name, "weight_decay": 0.01}, net, 0.1)
        if not ours:
            rule = paddle.optimizer.SGD if name == "SGD" else paddle.optimizer.Adam
            assert type(opt).__mro__[2] is rule
            opt = rule(learning_rate=0.1, parameters=opt._param_groups)
        for i in range(3):
            net(paddle.full([5, 4], 0.3 * i - 0.5)).square().sum().backward()
            opt.step()
            opt.clear_grad()
        results.append({n: p.numpy() for n, p in net.named_parameters()})
    for n in results[0]:
        np.testing.assert_allclose(results[0][n], results[1][n], rtol=1e-6, atol=1e-7, err_msg=n)
    assert any(np.abs(results[0][n]).sum() > 0 for n in DECAYED)


def test_rebuilding_keeps_own_regularizer_and_resets_groups():
    net = Net()
    build_optimizer({"name": "SGD", "weight_decay": 0.01}, net, 0.1)   # paddle overwrites param.regularizer
    lr = 0.1
    _, before, after = zero_grad_step({"name": "SGD", "weight_decay": 0.02}, net=net, lr=lr)
    np.testing.assert_allclose(after["fc.weight"], before["fc.weight"] * (1 - lr * 0.02), rtol=1e-6)
    np.testing.assert_allclose(after["own.weight"], before["own.weight"] * (1 - lr * 0.5), rtol=1e-6)
    # AdamW after SGD: the L2 that SGD's groups attached must not linger as a coupled decay
    _, before, after = zero_grad_step({"name": "AdamW", "weight_decay": 0.02}, net=net, lr=lr)
    np.testing.assert_allclose(after["fc.weight"], before["fc.weight"] * (1 - lr * 0.02), rtol=1e-6)
    np.testing.assert_array_equal(after["fc.bias"], before["fc.bias"])


class Scalar(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.w = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(1.0))


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_centered_reaches_paddle(centered):
    # g = 1, rho 0.95, eps 1e-6, lr 0.1: ms = 0.05, mean g = 0.05
    # plain: 1 - 0.1 / sqrt(0.05 + 1e-6); centered: 1 - 0.1 / sqrt(0.05 - 0.05^2 + 1e-6)
    net = Scalar()
    opt = build_optimizer({"name": "RMSProp", "centered": centered}, net, 0.1)
    assert opt._centered is centered
    net.w.sum().backward()
    opt.step()
    ms = 0.05 - (0.05 ** 2 if centered else 0.0)
    assert net.w.numpy()[0] == pytest.approx(1 - 0.1 / math.sqrt(ms + 1e-6), rel=1e-6)


@pytest.mark.parametrize("centered,momentum", [(False, 0.0), (True, 0.0), (True, 0.5)])
def test_rmsprop_steps_follow_the_formulas_and_momentum_0_keeps_no_buffer(centered, momentum):
    # paddle.optimizer.RMSProp's documented rule, in numpy, with L2 (wd) added to the gradient:
    # ms = rho ms + (1 - rho) g^2; mg = rho mg + (1 - rho) g (centered; else mg = 0);
    # v = momentum v + lr g / sqrt(ms - mg^2 + eps); w -= v. Three steps on gradients of 0.5 w^2 + c w.
    rho, eps, lr, wd = 0.9, 1e-6, 0.01, 0.1
    rng = np.random.default_rng(0)
    w0, c = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    layer = paddle.nn.Linear(4, 3)
    layer.weight.set_value(w0.T.copy())
    opt = build_optimizer({"name": "RMSProp", "rho": rho, "epsilon": eps, "momentum": momentum,
                           "centered": centered, "weight_decay": wd, "no_decay": []}, layer, lr)
    w, ms, mg, v = w0.astype(np.float64), 0.0, 0.0, 0.0
    for _ in range(3):
        wt = layer.weight.T
        ((wt * wt).sum() / 2 + (wt * paddle.to_tensor(c)).sum()).backward()
        opt.step()
        opt.clear_grad()
        g = w + c + wd * w
        ms = rho * ms + (1 - rho) * g * g
        mg = rho * mg + (1 - rho) * g if centered else 0.0
        v = momentum * v + lr * g / np.sqrt(ms - mg * mg + eps)
        w = w - v
        np.testing.assert_allclose(layer.weight.numpy().T, w, rtol=1e-5, atol=1e-7)
    buffers = [k for k in opt.state_dict() if "momentum" in k]
    # at momentum 0 no parameter-sized momentum buffer is kept (issue 42: 415 MB on AttentionLSTM)
    assert len(buffers) == (1 if momentum else 0), buffers   # the weight only: the bias gets no gradient


def test_momentum_and_adam_options_reach_paddle():
    opt = build_optimizer({"name": "Momentum", "momentum": 0.8, "use_nesterov": True}, Scalar(), 0.1)
    assert opt._momentum == 0.8 and opt._use_nesterov is True
    opt = build_optimizer({"name": "Adam", "beta1": 0.5, "beta2": 0.6, "epsilon": 1e-3}, Scalar(), 0.1)
    assert (opt._beta1, opt._beta2, opt._epsilon) == (0.5, 0.6, 1e-3)


def test_clip_grad_norm_math():
    a, b = Scalar(), Scalar()
    a.w.set_value(paddle.to_tensor([3.0]))
    b.w.set_value(paddle.to_tensor([4.0]))
    ((a.w ** 2).sum() / 2 + (b.w ** 2).sum() / 2).backward()   # grads 3 and 4: global norm 5
    params = [a.w, b.w]
    assert clip_grad_norm_(params, 10.0).item() == pytest.approx(5.0)
    assert a.w.grad.numpy()[0] == pytest.approx(3.0)                # below max_norm: unchanged
    assert clip_grad_norm_(iter(params), 1.0).item() == pytest.approx(5.0)
    assert (a.w.grad.numpy()[0], b.w.grad.numpy()[0]) == pytest.approx((0.6, 0.8), rel=1e-5)


def test_unknown_optimizer_lists_known_ones():
    with pytest.raises(ConfigError, match=r"unknown optimizer 'Adamw'.*known: Adam, AdamW, Momentum, "
                                          r"RMSProp, SGD"):
        build_optimizer({"name": "Adamw"}, Scalar(), 0.1)
    with pytest.raises(ConfigError, match="weight_decay must be >= 0"):
        build_optimizer({"name": "SGD", "weight_decay": -1.0}, Scalar(), 0.1)


def test_attention_lstm_recipe_shapes():
    lr = build_lr({"name": "Piecewise", "boundaries": [5, 8], "values": [0.00025, 2.5e-5, 2.5e-6],
                   "by": "epoch"}, 3, 30)
    opt = build_optimizer({"name": "RMSProp", "centered": True, "weight_decay": 4e-4}, Net(), lr)
    assert opt._centered and opt.get_lr() == pytest.approx(2.5e-4)
    for _ in range(15):
        lr.step()
    assert opt.get_lr() == pytest.approx(2.5e-5)


def test_iteration_based_recipes_as_published():
    """DeepLabV3 (PaddleSeg): 80k iterations, poly power 0.9 from 0.01; BERT pretraining: 1M steps,
    10k warm-up then linear decay to 0 (PaddleNLP's LinearDecayWithWarmup). Values by hand."""
    poly = build_lr({"name": "Polynomial", "learning_rate": 0.01, "power": 0.9}, 1000, 80000)
    assert poly.lr_at(0) == pytest.approx(0.01)
    assert poly.lr_at(40000) == pytest.approx(0.01 * 0.5 ** 0.9)
    assert poly.lr_at(80000) == pytest.approx(0.0)
    bert = build_lr({"name": "LinearDecay", "learning_rate": 1e-4, "warmup_steps": 10000}, 5000, 1000000)
    assert bert.lr_at(5000) == pytest.approx(0.5e-4)
    assert bert.lr_at(10000) == pytest.approx(1e-4)
    assert bert.lr_at(505000) == pytest.approx(1e-4 * 0.5)      # (1M - 505k) / (1M - 10k)


def _small_net():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 6), paddle.nn.LayerNorm(6), paddle.nn.Linear(6, 3))


@pytest.mark.parametrize("cfg", [{"name": "Momentum", "momentum": 0.9, "weight_decay": 1e-4},
                                 {"name": "Momentum", "momentum": 0.9, "use_nesterov": True},
                                 {"name": "Adam", "weight_decay": 1e-3}])
def test_on_a_gpu_momentum_and_adam_take_the_merged_kernels_with_the_same_updates(cfg, monkeypatch):
    """Parameters on a GPU (Place patched while the optimizer is built) select use_multi_tensor; the
    merged kernels (which paddle also has on the CPU) then give the per-parameter updates (Momentum
    exactly, Adam within float rounding), and their state dicts load into each other (a run trained
    on a GPU resumes on a CPU)."""
    place = type(paddle.zeros([1]).place)
    results, states = [], []

    def by_position(state, net):   # accumulator keys start with paddle's unique parameter names
        names = sorted(((p.name, str(i)) for i, p in enumerate(net.parameters())), key=lambda t: -len(t[0]))
        out = set()
        for k in state:
            if k != "LR_Scheduler":
                out.add(next((i + k[len(n):] for n, i in names if k.startswith(n + "_")), k))
        return out
    for gpu in (False, True):
        net = _small_net()
        with monkeypatch.context() as m:
            if gpu:
                m.setattr(place, "is_cpu_place", lambda self: False)
            opt = build_optimizer(dict(cfg), net, 0.1)
        assert opt._use_multi_tensor is gpu
        for i in range(4):
            loss = net(paddle.full([5, 8], 0.5 * i - 1.0)).square().sum()
            loss.backward()
            opt.step()
            opt.clear_grad()
        results.append([p.numpy() for p in net.parameters()])
        states.append((opt.state_dict(), by_position(opt.state_dict(), net)))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 if cfg["name"] == "Adam" else 0)
    assert states[0][1] == states[1][1] and len(states[0][1]) >= len(results[0])


def test_adamw_has_no_merged_kernel_and_updates_per_parameter(monkeypatch):
    place = type(paddle.zeros([1]).place)
    monkeypatch.setattr(place, "is_cpu_place", lambda self: False)
    opt = build_optimizer({"name": "AdamW", "weight_decay": 0.01}, _small_net(), 0.1)
    assert not getattr(opt, "_use_multi_tensor", False)
