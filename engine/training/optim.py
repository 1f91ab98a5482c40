"""Optimizers and learning-rate schedules built from the `optimizer:` and `lr:` config blocks.

The learning rate lives in ONE place, the `lr` block (`learning_rate`, or Piecewise `values`);
the optimizer block holds only the update rule and the weight decay:

    optimizer: {name: RMSProp, centered: true, weight_decay: 4.0e-4, no_decay: [bias, norm]}
    lr: {name: Piecewise, boundaries: [5, 8], values: [2.5e-4, 2.5e-5, 2.5e-6], by: epoch}

    lr: {name: StepDecay, learning_rate: 2.0e-4, step_size: 12500, gamma: 0.8, by: step}
    lr: {name: Cosine, learning_rate: 0.1, eta_min: 0.0, warmup_epochs: 5}

Schedules are pure functions of the optimizer step t (0 = the first update): the trainer calls
`scheduler.step()` once per optimizer step, epoch-based settings (`by: epoch`, `warmup_epochs`)
are converted with `steps_per_epoch`, and a resumed run only needs the step count (the LRScheduler
state) to continue exactly. Warm-up (every schedule but Noam, whose formula has its own): for
t < W the lr rises linearly from `warmup_start_lr` (at t=0) towards the base lr (reached at t=W),
as paddle's LinearWarmup does. After it, milestone schedules (Piecewise, StepDecay) keep their
absolute boundaries (epoch 5 stays epoch 5), while the continuous decays (LinearDecay, Polynomial,
Cosine) start at the base lr at t=W and reach their end value `decay_steps` later (default: the
end of training), as PaddleClas/PaddleSeg/PaddleNLP do with warm-up.

Weight decay: `weight_decay` is L2 regularisation added to the gradient for SGD, Momentum, Adam
and RMSProp, and decoupled decay for AdamW. `no_decay` (default [bias, norm]) exempts biases
(1-D parameters named *bias or *.b_N), the parameters of normalisation layers (found by layer
type), and parameters whose name contains any other listed string. A parameter with its own
`regularizer` in its ParamAttr keeps it and gets nothing else (paddle's rule).
Gradient clipping is not inside the optimizer: the trainer reads `train.clip_grad_norm` and calls
`clip_grad_norm_` itself, after unscaling AMP gradients and before `step()`.
"""
import bisect
import math
import typing

import paddle
from paddle import _C_ops
from paddle.optimizer.lr import LRScheduler

from engine.model import NormLayer
from engine.errors import ConfigError
from engine.registry import LR_SCHEDULES, OPTIMIZERS
import ops
from ops.reference import on_device


# ----------------------------------------------------------------------------- learning rate

class ScheduleLR(LRScheduler):
    """A paddle LRScheduler whose lr is `fn(step)`; `last_epoch` counts optimizer steps."""

    def __init__(self, fn, name):
        self.lr_at = fn
        self.schedule_name = name
        super().__init__(learning_rate=float(fn(0)), last_epoch=-1)

    def get_lr(self):
        return float(self.lr_at(max(self.last_epoch, 0)))


# the units a milestone schedule counts in (its `by`): one declaration for the check and the docs
By = typing.Literal["epoch", "step"]


def _steps(key, value, by, steps_per_epoch):
    if by == "epoch":
        return int(round(value * steps_per_epoch))
    if by == "step":
        return int(value)
    raise ConfigError(f"lr.{key}: 'by' must be {' or '.join(map(repr, typing.get_args(By)))}, got {by!r}")


class _Schedule:
    """Common keys of every schedule except Noam; subclasses define `after_warmup(t)`.

    Args:
        learning_rate: the base lr, reached at the end of the warm-up; required, except by Piecewise
            with `values`.
        warmup_steps: optimizer steps of linear warm-up from `warmup_start_lr` to the base lr (0: none);
            give it or `warmup_epochs`, not both.
        warmup_epochs: the warm-up in epochs, converted with the steps per epoch (fractions allowed).
        warmup_start_lr: the lr of the first update of the warm-up.
    """

    def __init__(self, learning_rate=None, warmup_steps=0, warmup_epochs=0.0, warmup_start_lr=0.0):
        if warmup_steps and warmup_epochs:
            raise ConfigError("lr: give warmup_steps or warmup_epochs, not both")
        if warmup_steps < 0 or warmup_epochs < 0:
            raise ConfigError("lr: warmup_steps / warmup_epochs must be >= 0")
        self.learning_rate = learning_rate
        self.warmup_steps, self.warmup_epochs = warmup_steps, warmup_epochs
        self.warmup_start_lr = warmup_start_lr

    def _base(self, base_lr):
        base = self.learning_rate if base_lr is None else base_lr
        if base is None:
            raise ConfigError(f"lr.learning_rate is required for {type(self).__name__}")
        if base < 0:
            raise ConfigError(f"lr.learning_rate must be >= 0, got {base}")
        return float(base)

    def build(self, steps_per_epoch, total_steps, base_lr=None):
        self.base = self._base(base_lr)
        self.spe, self.total = steps_per_epoch, total_steps
        self.warmup = self.warmup_steps or int(round(self.warmup_epochs * steps_per_epoch))
        self.prepare()
        return ScheduleLR(self.lr_at, type(self).__name__)

    def prepare(self):
        pass

    def lr_at(self, t):
        if t < self.warmup:
            return self.warmup_start_lr + (self.base - self.warmup_start_lr) * t / self.warmup
        return self.after_warmup(t)

    def progress(self, t, decay_steps):
        """Fraction of the decay done at step t (0 at the end of warm-up, 1 at the end)."""
        span = decay_steps or (self.total - self.warmup)
        return min(max(t - self.warmup, 0) / span, 1.0) if span > 0 else 1.0


@LR_SCHEDULES.register("Constant")
class Constant(_Schedule):
    def __init__(self, *, learning_rate: float = None, warmup_steps: int = 0,
                 warmup_epochs: float = 0.0, warmup_start_lr: float = 0.0):
        super().__init__(learning_rate, warmup_steps, warmup_epochs, warmup_start_lr)

    def after_warmup(self, t):
        return self.base


@LR_SCHEDULES.register("Piecewise")
class Piecewise(_Schedule):
    """lr = values[i] (or learning_rate * gamma**i) after the i-th boundary; paddle's PiecewiseDecay.

    Args:
        boundaries: strictly increasing epochs (steps with `by: step`) where the lr moves to its next
            level; absolute, so a warm-up does not shift them.
        values: the lrs, one more than the boundaries; values[0] is the base lr (leave `learning_rate`
            out). Give `values` or `gamma`.
        gamma: instead of `values`, the factor each boundary multiplies the lr by (learning_rate *
            gamma**i).
        by: the unit of `boundaries`.
    """

    def __init__(self, *, boundaries: list, values: list = None, gamma: float = None, by: By = "epoch",
                 learning_rate: float = None, warmup_steps: int = 0, warmup_epochs: float = 0.0,
                 warmup_start_lr: float = 0.0):
        super().__init__(learning_rate, warmup_steps, warmup_epochs, warmup_start_lr)
        if list(boundaries) != sorted(boundaries) or len(set(boundaries)) != len(boundaries):
            raise ConfigError(f"lr.boundaries must be strictly increasing, got {boundaries}")
        if (values is None) == (gamma is None):
            raise ConfigError("lr: Piecewise takes either 'values' (absolute lrs) or 'gamma' (a factor "
                              "per boundary), not both or neither")
        if values is not None:
            if len(values) != len(boundaries) + 1:
                raise ConfigError(f"lr.values: Piecewise needs {len(boundaries) + 1} values for "
                                  f"{len(boundaries)} boundaries, got {len(values)}")
            if any(v < 0 for v in values):
                raise ConfigError(f"lr.values must all be >= 0, got {values}")
            if learning_rate is not None and learning_rate != values[0]:
                raise ConfigError(f"lr.learning_rate ({learning_rate}) differs from lr.values[0] "
                                  f"({values[0]}); drop learning_rate, values[0] is the base lr")
        _steps("by", 0, by, 1)
        self.boundaries, self.values, self.gamma, self.by = list(boundaries), values, gamma, by

    def _base(self, base_lr):
        if self.values is None:
            return super()._base(base_lr)
        return float(self.values[0] if base_lr is None else base_lr)

    def prepare(self):
        self.bounds = [_steps("boundaries", b, self.by, self.spe) for b in self.boundaries]
        if self.values is not None:   # a base_lr override scales every value alike
            scale = self.base / self.values[0] if self.values[0] else 1.0
            self.levels = [v * scale for v in self.values]
        else:
            self.levels = [self.base * self.gamma ** i for i in range(len(self.bounds) + 1)]

    def after_warmup(self, t):
        return self.levels[bisect.bisect_right(self.bounds, t)]


@LR_SCHEDULES.register("StepDecay")
class StepDecay(_Schedule):
    """lr = learning_rate * gamma ** floor(t / step_size) (NeXtVLAD: 0.8 every 12,500 steps).

    Args:
        step_size: the interval, in `by` units, after which the lr is multiplied by `gamma` (> 0;
            fractional epochs allowed).
        gamma: the factor applied at every interval.
        by: the unit of `step_size`.
    """

    def __init__(self, *, step_size: float, gamma: float = 0.1, by: By = "epoch",
                 learning_rate: float = None, warmup_steps: int = 0, warmup_epochs: float = 0.0,
                 warmup_start_lr: float = 0.0):
        super().__init__(learning_rate, warmup_steps, warmup_epochs, warmup_start_lr)
        if step_size <= 0:
            raise ConfigError(f"lr.step_size must be > 0, got {step_size}")
        _steps("by", 0, by, 1)
        self.step_size, self.gamma, self.by = step_size, gamma, by

    def prepare(self):
        self.size = max(1, _steps("step_size", self.step_size, self.by, self.spe))

    def after_warmup(self, t):
        return self.base * self.gamma ** (t // self.size)


@LR_SCHEDULES.register("Polynomial")
class Polynomial(_Schedule):
    """lr = (base - end_lr) * (1 - p) ** power + end_lr, p the decay progress (paddle PolynomialDecay).

    Args:
        power: the exponent of (1 - p): 1 decays linearly, 0.9 is PaddleSeg's "poly" schedule.
        end_lr: the lr at the end of the decay, kept after it.
        decay_steps: optimizer steps from the end of the warm-up to `end_lr` (0: the rest of training).
    """

    def __init__(self, *, power: float = 1.0, end_lr: float = 0.0, decay_steps: int = 0,
                 learning_rate: float = None, warmup_steps: int = 0, warmup_epochs: float = 0.0,
                 warmup_start_lr: float = 0.0):
        super().__init__(learning_rate, warmup_steps, warmup_epochs, warmup_start_lr)
        self.power, self.end_lr, self.decay_steps = power, end_lr, decay_steps

    def after_warmup(self, t):
        p = self.progress(t, self.decay_steps)
        return (self.base - self.end_lr) * (1 - p) ** self.power + self.end_lr


@LR_SCHEDULES.register("LinearDecay")
class LinearDecay(Polynomial):
    """Polynomial with power 1: from the base lr to end_lr (BERT fine-tuning)."""

    def __init__(self, *, end_lr: float = 0.0, decay_steps: int = 0, learning_rate: float = None,
                 warmup_steps: int = 0, warmup_epochs: float = 0.0, warmup_start_lr: float = 0.0):
        super().__init__(power=1.0, end_lr=end_lr, decay_steps=decay_steps, learning_rate=learning_rate,
                         warmup_steps=warmup_steps, warmup_epochs=warmup_epochs,
                         warmup_start_lr=warmup_start_lr)


@LR_SCHEDULES.register("Cosine")
class Cosine(_Schedule):
    """lr = eta_min + (base - eta_min) * (1 + cos(pi * p)) / 2, p the decay progress.

    Args:
        eta_min: the lr at the end of the decay, kept after it.
        decay_steps: optimizer steps from the end of the warm-up to `eta_min` (0: the rest of training).
    """

    def __init__(self, *, eta_min: float = 0.0, decay_steps: int = 0, learning_rate: float = None,
                 warmup_steps: int = 0, warmup_epochs: float = 0.0, warmup_start_lr: float = 0.0):
        super().__init__(learning_rate, warmup_steps, warmup_epochs, warmup_start_lr)
        self.eta_min, self.decay_steps = eta_min, decay_steps

    def after_warmup(self, t):
        p = self.progress(t, self.decay_steps)
        return self.eta_min + (self.base - self.eta_min) * (1 + math.cos(math.pi * p)) / 2


@LR_SCHEDULES.register("Noam")
class Noam(_Schedule):
    """lr = learning_rate * d_model**-0.5 * min(n**-0.5, n * warmup_steps**-1.5), n = t + 1.

    "Attention is all you need"; n counts from 1 as in Fluid's noam_decay, so the first update
    does not get lr 0. The warm-up is the formula's own linear rise.

    Args:
        d_model: the model width whose inverse square root scales the lr (the Transformer's
            `d_model`), > 0.
        warmup_steps: optimizer steps of the formula's rise; the lr peaks at step `warmup_steps`, then
            falls as the inverse square root of the step.
        learning_rate: a factor on the formula (1.0 in the paper).
    """

    def __init__(self, *, d_model: int, warmup_steps: int, learning_rate: float = 1.0):
        super().__init__(learning_rate)
        if d_model <= 0 or warmup_steps <= 0:
            raise ConfigError(f"lr: Noam needs d_model > 0 and warmup_steps > 0, got {d_model}, "
                              f"{warmup_steps}")
        self.d_model, self.noam_warmup = d_model, warmup_steps

    def lr_at(self, t):
        n = t + 1
        return self.base * self.d_model ** -0.5 * min(n ** -0.5, n * self.noam_warmup ** -1.5)


def build_lr(cfg, steps_per_epoch, total_steps, base_lr=None):
    """LRScheduler from the `lr` block; the train step calls `.step()` after every optimizer step.

    `base_lr`, if given, replaces `lr.learning_rate` (Piecewise `values` are scaled alike); leave
    it None to use the config. `steps_per_epoch` converts epoch-based settings to steps;
    `total_steps` (epochs x steps per epoch, or `train.max_steps`) is where decays end by default.
    """
    if steps_per_epoch < 1 or total_steps < 1:
        raise ConfigError(f"steps_per_epoch and total_steps must be >= 1, got {steps_per_epoch}, {total_steps}")
    return LR_SCHEDULES.build(cfg).build(steps_per_epoch, total_steps, base_lr)


# ----------------------------------------------------------------------------- parameter groups

class _GroupL2Decay(paddle.regularizer.L2Decay):
    """The L2 we attach through a parameter group; tells it apart from a ParamAttr regularizer."""


def _norm_layer_types():
    norm = paddle.nn.layer.norm
    names = ["BatchNorm", "_BatchNormBase", "LayerNorm", "GroupNorm", "_InstanceNormBase", "RMSNorm"]
    return tuple(getattr(norm, n) for n in names if hasattr(norm, n)) + (NormLayer,)


def _own_regularizer(param):
    # paddle's param groups overwrite `param.regularizer`; remember what the ParamAttr gave
    if not hasattr(param, "_zoo_own_regularizer"):
        reg = getattr(param, "regularizer", None)
        param._zoo_own_regularizer = None if isinstance(reg, _GroupL2Decay) else reg
    return param._zoo_own_regularizer


def split_decay(model, no_decay=("bias", "norm")):
    """(decay, no_decay, own): lists of (structured name, parameter) of the model's parameters.

    `own` holds the parameters with their own ParamAttr regularizer. A custom normalisation
    layer opts in to the "norm" rule by deriving from `engine.model.NormLayer`.
    """
    tokens = [str(t) for t in no_decay]
    norm_params = set()
    if "norm" in tokens:
        types = _norm_layer_types()
        for _, layer in model.named_sublayers(include_self=True):
            if isinstance(layer, types):
                norm_params.update(id(p) for p in layer.parameters(include_sublayers=False))
    substrings = [t for t in tokens if t not in ("bias", "norm")]
    decay, exempt, own = [], [], []
    for name, p in model.named_parameters():
        is_bias = len(p.shape) == 1 and (name.endswith("bias") or ".b_" in p.name)
        if _own_regularizer(p) is not None:
            own.append((name, p))
        elif (("bias" in tokens and is_bias) or id(p) in norm_params
              or any(s in name for s in substrings)):
            exempt.append((name, p))
        else:
            decay.append((name, p))
    return decay, exempt, own


def param_groups(model, weight_decay, no_decay, decoupled):
    """paddle parameter groups carrying the per-group decay (float for AdamW, regularizer else)."""
    decay, exempt, own = split_decay(model, no_decay)
    for _, p in decay + exempt + own:
        p.regularizer = _own_regularizer(p)   # undo what an earlier optimizer's groups set
    if decoupled:
        groups = [{"params": [p for _, p in decay], "weight_decay": float(weight_decay)},
                  {"params": [p for _, p in exempt + own], "weight_decay": 0.0}]
    else:
        groups = [{"params": [p for _, p in decay],
                   "weight_decay": _GroupL2Decay(weight_decay) if weight_decay else None},
                  {"params": [p for _, p in exempt], "weight_decay": None}]
        by_reg = {}
        for _, p in own:
            by_reg.setdefault(id(p.regularizer), (p.regularizer, []))[1].append(p)
        groups += [{"params": ps, "weight_decay": reg} for reg, ps in by_reg.values()]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ConfigError(f"optimizer: model {type(model).__name__} has no parameters")
    return groups


# ----------------------------------------------------------------------------- optimizers

class _Optimizer:
    """`multi_tensor`: Momentum and Adam update all parameters of a group in one merged kernel
    (paddle's merged_momentum / merged_adam) when the parameters are on a GPU, where one launch per
    parameter costs more than the update; on a CPU the per-parameter kernels run (same values:
    tests/test_optim.py). paddle 3.3.1's AdamW has no multi-tensor form (its fused_adam op is a GPU
    kernel without a public optimizer), so AdamW updates per parameter everywhere.

    Args:
        weight_decay: the L2 coefficient added to the gradient (w * weight_decay), >= 0 (0: none).
        no_decay: what weight decay spares: `bias` (1-D parameters named *bias), `norm` (the
            parameters of normalisation layers) and parameters whose name contains any other listed
            string.
    """
    decoupled = False

    def __init__(self, weight_decay=0.0, no_decay=("bias", "norm")):
        if weight_decay < 0:
            raise ConfigError(f"optimizer.weight_decay must be >= 0, got {weight_decay}")
        self.weight_decay, self.no_decay = weight_decay, list(no_decay)
        self.multi_tensor = False

    def create(self, model, lr):
        groups = param_groups(model, self.weight_decay, self.no_decay, self.decoupled)
        self.multi_tensor = on_device(groups[0]["params"][0])
        return self.make(lr, groups)


@OPTIMIZERS.register("SGD")
class SGD(_Optimizer):
    """Plain SGD: w -= lr * g."""

    def __init__(self, *, weight_decay: float = 0.0, no_decay: list = ["bias", "norm"]):  # noqa: B006
        super().__init__(weight_decay, no_decay)

    def make(self, lr, groups):
        return _SGD(learning_rate=lr, parameters=groups)


@OPTIMIZERS.register("Momentum")
class Momentum(_Optimizer):
    """SGD with momentum (paddle's Momentum, a merged kernel on a GPU).

    Args:
        momentum: the factor the velocity keeps each step (v = momentum * v + g).
        use_nesterov: Nesterov momentum: the update adds the gradient to the look-ahead velocity.
    """

    def __init__(self, *, momentum: float = 0.9, use_nesterov: bool = False, weight_decay: float = 0.0,
                 no_decay: list = ["bias", "norm"]):  # noqa: B006
        super().__init__(weight_decay, no_decay)
        self.momentum, self.use_nesterov = momentum, use_nesterov

    def make(self, lr, groups):
        return paddle.optimizer.Momentum(learning_rate=lr, momentum=self.momentum, parameters=groups,
                                         use_nesterov=self.use_nesterov, use_multi_tensor=self.multi_tensor)


@OPTIMIZERS.register("Adam")
class Adam(_Optimizer):
    """Adam (paddle's, a merged kernel on a GPU), with L2 weight decay in the gradient.

    Args:
        beta1: decay rate of the running mean of the gradient (first moment).
        beta2: decay rate of the running mean of the squared gradient (second moment).
        epsilon: added to the square root of the second moment so the step stays finite where it is 0.
    """

    def __init__(self, *, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 weight_decay: float = 0.0, no_decay: list = ["bias", "norm"]):  # noqa: B006
        super().__init__(weight_decay, no_decay)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def make(self, lr, groups):
        return _Adam(learning_rate=lr, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon, parameters=groups,
                     use_multi_tensor=self.multi_tensor)


@OPTIMIZERS.register("AdamW")
class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): the weights shrink by lr *
    weight_decay each step, outside the adaptive update.

    Args:
        weight_decay: the decoupled decay coefficient (w -= lr * weight_decay * w), >= 0 (0: none).
    """
    decoupled = True

    def make(self, lr, groups):
        return paddle.optimizer.AdamW(learning_rate=lr, beta1=self.beta1, beta2=self.beta2,
                                      epsilon=self.epsilon, parameters=groups, weight_decay=0.0)


@OPTIMIZERS.register("RMSProp")
class RMSProp(_Optimizer):
    """RMSProp (paddle's; at momentum 0 without its momentum buffer).

    Args:
        rho: decay rate of the running mean of the squared gradient.
        epsilon: added under the square root of that mean (paddle's placement; PyTorch adds it after
            the root), so the step stays finite.
        momentum: momentum of the update (0: none, and no momentum buffer is kept).
        centered: divide by an estimate of the gradient's variance (mean square minus the squared
            running mean of the gradient) instead of its mean square.
    """

    def __init__(self, *, rho: float = 0.95, epsilon: float = 1e-6, momentum: float = 0.0,
                 centered: bool = False, weight_decay: float = 0.0,
                 no_decay: list = ["bias", "norm"]):  # noqa: B006
        super().__init__(weight_decay, no_decay)
        self.rho, self.epsilon, self.momentum, self.centered = rho, epsilon, momentum, centered

    def make(self, lr, groups):
        rule = paddle.optimizer.RMSProp if self.momentum else _RMSPropWithoutMomentum
        return rule(learning_rate=lr, rho=self.rho, epsilon=self.epsilon, momentum=self.momentum,
                    centered=self.centered, parameters=groups)


class _L2IntoGradient:
    """L2 decay added into the gradient in place, one parameter at a time, for the optimizers whose
    kernel does not take it (paddle's Momentum does). paddle's makes two new tensors per parameter
    (coeff * w and g + coeff * w) and keeps them all until every update is made: AttentionLSTM's
    peak was there (docs/performance.md#cpu-environment). The gradient is dead after the update (the trainer clears it). A parameter kept in
    fp16/bf16 with an fp32 master copy, or a sparse gradient, takes paddle's way."""

    def _own_path(self, param, grad=None):
        return param.dtype == paddle.float32 and (grad is None or (grad.dtype == param.dtype and grad.is_dense()))

    def _create_regularization_of_grad(self, param, grad, regularization=None):
        reg = getattr(param, "regularizer", None) or regularization
        if (grad is None or not isinstance(reg, paddle.regularizer.L2Decay) or not paddle.in_dynamic_mode()
                or not self._own_path(param, grad)):
            return super()._create_regularization_of_grad(param, grad, regularization)
        grad.add_(param * reg._coeff)
        return grad


class _SGD(_L2IntoGradient, paddle.optimizer.SGD):
    pass


class _Adam(_L2IntoGradient, paddle.optimizer.Adam):
    pass


class _RMSPropWithoutMomentum(_L2IntoGradient, paddle.optimizer.RMSProp):
    """paddle's RMSProp at momentum 0, without its `momentum` accumulator.

    paddle keeps that accumulator for every parameter even at momentum 0, where its kernel only uses
    it to carry the step's update (v = 0 * v + lr * g / sqrt(ms - mg^2 + eps); p -= v): a full copy of
    the parameters kept for nothing (a third of AttentionLSTM's optimizer state:
    docs/performance.md#cpu-environment; PyTorch's RMSProp has no such buffer at momentum 0). Here the gradient, dead once the update is made, is
    passed as that buffer: the kernel reads g[i] and writes v[i] element by element, so sharing the
    storage is safe (tests/test_optim.py checks the updates against the formulas). A parameter kept
    in fp16/bf16 with an fp32 master copy keeps paddle's own path (its update is fp32, its gradient not).
    Its L2 decay goes into the gradient in place (_L2IntoGradient).
    """

    def _create_accumulators(self, block, parameters):
        params = parameters.get("params") if isinstance(parameters, dict) else parameters
        paddle_path = []
        for p in params:
            if p.name in self._already_create_accumulator:
                continue
            if not self._own_path(p):
                paddle_path.append(p)
                continue
            self._add_accumulator(self._mean_square_acc_str, p)
            self._add_accumulator(self._mean_grad_acc_str, p)
            self._already_create_accumulator.add(p.name)
        if paddle_path:
            super()._create_accumulators(block, paddle_path)

    def _append_optimize_op(self, block, param_and_grad):
        if isinstance(param_and_grad, dict):
            param_and_grad = self._update_param_group(param_and_grad)
        param, grad = param_and_grad
        if not paddle.in_dynamic_mode() or not self._own_path(param, grad):
            return super()._append_optimize_op(block, param_and_grad)
        # paddle's own kernel, its moment buffer the gradient (see the class docstring)
        _C_ops.rmsprop_(param, self._get_accumulator_master(self._mean_square_acc_str, param), grad, grad,
                        self._create_param_lr(param_and_grad),
                        self._get_accumulator_master(self._mean_grad_acc_str, param), None,
                        self._epsilon, self._rho, 0.0, self._centered, False)
        return None


def build_optimizer(cfg, model, lr):
    """paddle Optimizer from the `optimizer` block; `lr` is the LRScheduler from `build_lr` (or a float)."""
    return OPTIMIZERS.build(cfg).create(model, lr)


def clip_grad_norm_(parameters, max_norm):
    """Scale all gradients so that their global L2 norm is at most max_norm; returns the norm (an fp32 Tensor).

    Call after `GradScaler.unscale_(optimizer)` and before `optimizer.step()`. paddle's
    clip_grad_norm_ arithmetic (the norm of the per-gradient norms, the factor
    min(1, max_norm / (norm + 1e-6))), with each gradient's norm taken in fp32: under AMP O2 the
    gradients mix fp16/bf16 (cast layers) with fp32 (norm layers), which paddle's version cannot
    stack, and an fp16 sum of squares overflows at 65504.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return paddle.zeros([], "float32")
    fp32 = paddle.float32
    norm = paddle.linalg.norm(ops.grad_norms([g.detach() for g in grads]))
    factor = (max_norm / (norm + 1e-6)).clip_(max=1.0)
    # nothing to scale; on a CPU reading the factor waits for no device. on_device looked up on the
    # module: tests/test_host_round_trips.py patches it there to run this as on a GPU
    if not ops.reference.on_device(grads[0]) and float(factor) == 1.0:
        return norm
    for g in grads:
        if g.dtype == fp32:
            g.detach().multiply_(factor)
        else:   # scaled in fp32 and rounded once (CPUs have no fp16 multiply)
            paddle.assign((g.detach().astype(fp32) * factor).astype(g.dtype), output=g.detach())
    return norm
