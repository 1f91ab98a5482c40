"""BERT (Devlin et al. 2018): BertModel, BertForPretraining (MLM + NSP), BertForSequenceClassification.

Architecture facts (PaddleNLP `transformers/bert/modeling.py`, HF `modeling_bert.py`): embeddings
(word + position + token type, LayerNorm, dropout), post-LN encoder layers (self-attention, add &
LayerNorm, FFN with exact erf GELU, add & LayerNorm; no dropout after the activation), a tanh pooler
on [CLS]; LayerNorm epsilon 1e-12; weights N(0, 0.02). Parameter names are PaddleNLP's (>= 2.5),
so its files load with no renaming; the legacy (<= 2.4) files differ only in alias keys of the tied
MLM decoder, dropped by the entries. Hugging Face checkpoints load through the `huggingface` layout
(renames + Linear transposes), also from a folder with config.json and model.safetensors. The
entries and the key maps are in models/nlp/bert_weights.py; the engine reads a folder's config.json
and vocab.txt, and the models compare what it read with their settings (`check_weights_config`).

The encoder layer is built from the layer package's blocks (ops/: one GEMM for q, k, v, fused
attention, add & norm), which run fused kernels in training on the CPU and plain paddle ops
otherwise. Attention is swappable with `set_attention(fn)`; the default is matmul(q, k^T) + additive
mask, softmax, dropout, matmul: on our CPUs this beats `F.scaled_dot_product_attention`.
`recompute: true` re-runs each encoder layer's forward during backward instead of keeping its
activations (activation checkpointing): the same gradients, with dropout too, for less memory, on
one card or several (non-reentrant recompute).

The small Python API for use outside the tools (`load_bert`, `load_tokenizer`,
`sentence_embeddings`) is api/bert.py.
"""
import dataclasses
import os
import typing
import warnings

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.static import InputSpec

import ops
from engine.model import DataAgreement, Weights, ZooModel, recomputed
from engine.errors import ConfigError
from engine.registry import MODELS
from models.nlp.bert_weights import hf_layout, task_file_layout

# size -> (num_hidden_layers, hidden_size, num_attention_heads); FFN 4x hidden. base and large:
# the BERT paper; tiny .. medium: google-research/bert's 24 smaller models (README), L/H/A as named there.
SIZES = {
    "tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8), "medium": (8, 512, 8),
    "base": (12, 768, 12), "large": (24, 1024, 16),
}
# the model settings config.json (Hugging Face) and our constructors share, with their names
CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps")


# ------------------------------------------------------------------------------------- attention
def set_attention(fn):
    """Make every attention layer use `fn(q, k, v, bias, dropout_p, training)`; returns the previous
    one (ops.set_attention: BERT's layers and the Transformer's share it)."""
    return ops.set_attention(fn)


def softmax_ce(logits, label):
    """Per-row softmax cross-entropy in one fused kernel (paddle calls the API deprecated, not the op)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.softmax_with_cross_entropy(logits, label)


# ------------------------------------------------------------------------------------- layers
ACTIVATIONS = ("gelu", "gelu_new", "relu", "tanh")


def _activation(name):
    if name not in ACTIVATIONS:
        raise ConfigError(f"BERT: hidden_act '{name}' unknown; known: {', '.join(ACTIVATIONS)}")
    return ops.activation(name)


class BertEmbeddings(nn.Layer):
    def __init__(self, vocab_size, hidden_size, max_position, type_vocab_size, dropout, eps):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(max_position, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, epsilon=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids, position_ids):
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(x))


class SelfAttention(nn.Layer):
    """Multi-head self-attention up to, not including, `out_proj`: the encoder layer applies the
    output projection inside its add & norm (ops.linear_add_norm), where the bias is fused."""

    def __init__(self, hidden_size, num_heads, dropout):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x, bias):
        B, S, H = x.shape
        n = self.num_heads
        qkv = ops.linear(x, [self.q_proj, self.k_proj, self.v_proj])
        q, k, v = qkv.reshape([B, S, 3, n, H // n]).transpose([2, 0, 3, 1, 4]).unbind(0)
        out = ops.attention(q, k, v, bias, self.dropout, self.training)
        return out.transpose([0, 2, 1, 3]).reshape([B, S, H])


class EncoderLayer(nn.Layer):
    """Post-LN transformer layer with PaddleNLP's names (self_attn, linear1/2, norm1/2)."""

    def __init__(self, hidden_size, num_heads, intermediate_size, act, dropout, attention_dropout, eps):
        super().__init__()
        self.self_attn = SelfAttention(hidden_size, num_heads, attention_dropout)
        self.linear1 = nn.Linear(hidden_size, intermediate_size)
        self.linear2 = nn.Linear(intermediate_size, hidden_size)
        self.norm1 = nn.LayerNorm(hidden_size, epsilon=eps)
        self.norm2 = nn.LayerNorm(hidden_size, epsilon=eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        _activation(act)
        self.act_name = act

    def forward(self, x, bias):
        x = ops.linear_add_norm(self.self_attn(x, bias), self.self_attn.out_proj, x, self.norm1, self.dropout1.p,
                                self.training)
        h = ops.linear(x, self.linear1, act=self.act_name)
        return ops.linear_add_norm(h, self.linear2, x, self.norm2, self.dropout2.p, self.training)


class Encoder(nn.Layer):
    def __init__(self, layers, recompute=False):
        super().__init__()
        self.layers = nn.LayerList(layers)
        self.recompute = recompute

    def forward(self, x, bias):
        for layer in self.layers:
            if self.recompute and self.training and not x.stop_gradient:
                x = recomputed(layer, x, bias)
            else:
                x = layer(x, bias)
        return x


class BertPooler(nn.Layer):
    def __init__(self, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, sequence_output):
        return paddle.tanh(self.dense(sequence_output[:, 0]))


def bert_config(size="base", vocab_size=30522, hidden_size=None, num_hidden_layers=None,
                num_attention_heads=None, intermediate_size=None, hidden_act="gelu", hidden_dropout_prob=0.1,
                attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                layer_norm_eps=1e-12, initializer_range=0.02, pad_token_id=0, recompute=False):
    """The full settings: a size preset, then any explicit value."""
    if size not in SIZES:
        raise ConfigError(f"BERT: size '{size}' unknown; known: {', '.join(SIZES)}")
    layers, hidden, heads = SIZES[size]
    cfg = dict(vocab_size=vocab_size, hidden_size=hidden_size or hidden,
               num_hidden_layers=num_hidden_layers or layers, num_attention_heads=num_attention_heads or heads,
               hidden_act=hidden_act, hidden_dropout_prob=hidden_dropout_prob,
               attention_probs_dropout_prob=attention_probs_dropout_prob,
               max_position_embeddings=max_position_embeddings, type_vocab_size=type_vocab_size,
               layer_norm_eps=layer_norm_eps, initializer_range=initializer_range, pad_token_id=pad_token_id,
               recompute=recompute)
    cfg["intermediate_size"] = intermediate_size or 4 * cfg["hidden_size"]
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ConfigError(f"BERT: hidden_size {cfg['hidden_size']} is not a multiple of num_attention_heads "
                          f"{cfg['num_attention_heads']}")
    for key in ("vocab_size", "max_position_embeddings", "type_vocab_size"):
        if cfg[key] < 1:
            raise ConfigError(f"BERT: {key} must be >= 1, got {cfg[key]}")
    return cfg


def check_model_type(config, folder):
    """A Hugging Face config.json (parsed) of another model family is one line."""
    if config.get("model_type", "bert") != "bert":
        raise ConfigError(f"{os.path.join(folder, 'config.json')}: model_type is '{config.get('model_type')}', "
                          f"not 'bert'")


def check_hf_config(config, vocab_rows, folder, model_cfg):
    """One line when a Hugging Face folder's config.json (`config`, parsed; None: the folder has none)
    or vocab.txt (`vocab_rows`, its lines; None: no vocab.txt) disagrees with the model's settings."""
    if config is None:
        raise ConfigError(f"{folder}: no config.json (a Hugging Face folder has config.json, vocab.txt "
                          f"and model.safetensors)")
    check_model_type(config, folder)
    for key in CONFIG_KEYS:
        if key not in config:
            continue
        have, want = config[key], model_cfg[key]
        same = abs(float(have) - float(want)) <= 1e-6 * abs(float(want)) if key == "layer_norm_eps" else have == want
        if not same:
            raise ConfigError(f"{folder}/config.json: {key} is {have!r} but the model has {want!r} "
                              f"(set model.{key}: {have!r} in the recipe, or use another checkpoint)")
    if vocab_rows is not None and vocab_rows != model_cfg["vocab_size"]:
        raise ConfigError(f"{os.path.join(folder, 'vocab.txt')} has {vocab_rows} tokens but the model's embedding "
                          f"table has {model_cfg['vocab_size']} rows (vocab_size): vocab and weights do not match")


def _init_weights(layer, std):
    """N(0, std) for Linear and Embedding weights, zero biases, LayerNorm 1/0 (PaddleNLP, HF)."""
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            sub.weight.set_value(paddle.normal(0.0, std, sub.weight.shape))
            if isinstance(sub, nn.Linear) and sub.bias is not None:
                sub.bias.set_value(paddle.zeros(sub.bias.shape))


class BertModel(ZooModel):
    """The encoder: `forward(input_ids, token_type_ids, attention_mask)` -> (sequence_output, pooled)."""

    def weights(self):
        """Task heads in a file are dropped (logged); task-model files (`bert.` taken off) and Hugging
        Face checkpoints load too."""
        return Weights(foreign_keys=[r"cls\..*", r"classifier\..*"], layouts=[task_file_layout(), hf_layout("")])

    def check_weights_config(self, config, vocab_rows, folder):
        check_hf_config(config, vocab_rows, folder, self.config)

    def __init__(self, size="base", **kwargs):
        super().__init__()
        self.config = cfg = bert_config(size, **kwargs)
        eps = cfg["layer_norm_eps"]
        self.embeddings = BertEmbeddings(cfg["vocab_size"], cfg["hidden_size"], cfg["max_position_embeddings"],
                                         cfg["type_vocab_size"], cfg["hidden_dropout_prob"], eps)
        self.encoder = Encoder([EncoderLayer(cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"],
                                             cfg["hidden_act"], cfg["hidden_dropout_prob"],
                                             cfg["attention_probs_dropout_prob"], eps)
                                for _ in range(cfg["num_hidden_layers"])], cfg["recompute"])
        self.pooler = BertPooler(cfg["hidden_size"])
        if not _lazy():
            _init_weights(self, cfg["initializer_range"])

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, position_ids=None):
        B, S = input_ids.shape   # exported programs see B and S as tensors: checks in dynamic mode only
        if paddle.in_dynamic_mode() and S > self.config["max_position_embeddings"]:
            raise ConfigError(f"BERT: a batch of sequences of {S} tokens, more than max_position_embeddings "
                              f"{self.config['max_position_embeddings']} (lower the reader's max_seq_length)")
        if token_type_ids is None:
            token_type_ids = paddle.zeros_like(input_ids)
        if position_ids is None:
            position_ids = paddle.arange(S, dtype="int64").unsqueeze(0).expand([B, S])
        if attention_mask is None:
            attention_mask = (input_ids != self.config["pad_token_id"])
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        # additive mask [B, 1, 1, S]: 0 on tokens, -1e4 on padding (PaddleNLP; exp underflows to 0)
        bias = ((1.0 - attention_mask.astype(x.dtype)) * -1e4).unsqueeze([1, 2])
        seq = self.encoder(x, bias)
        return seq, self.pooler(seq)


def _lazy():
    try:
        # paddle-private module: a paddle without it takes the except below
        from paddle.nn.initializer.lazy_init import lazy_init_helper
        return lazy_init_helper().state
    except ImportError:  # pragma: no cover
        return False


def _tensor(x):
    """A tensor (or, while tracing for export, a program value) as is; numpy and lists converted."""
    return x if isinstance(x, (paddle.Tensor, paddle.pir.Value)) else paddle.to_tensor(np.asarray(x))


def bert_inputs(batch):
    """(input_ids, token_type_ids, attention_mask) from a batch (PadSequences adds input_ids_mask)."""
    if "input_ids" not in batch:
        raise ConfigError(f"BERT: the batch has no 'input_ids' (keys: {', '.join(sorted(batch))})")
    ids = _tensor(batch["input_ids"]).astype("int64")
    types = batch.get("token_type_ids")
    mask = batch.get("input_ids_mask", batch.get("attention_mask"))
    return ids, None if types is None else _tensor(types).astype("int64"), None if mask is None else _tensor(mask)


# ------------------------------------------------------------------------------------- task models
class _BertTask(ZooModel):
    """Shared by the task models: the encoder under `bert.`, and the layouts their files come in.

    Args:
        size: the preset of layers / hidden size / heads (base 12/768/12, large 24/1024/16; tiny to
            medium: google-research/bert's smaller models); the three keys below override it.
        vocab_size: the rows of the word embedding: the vocabulary's size (30522: BERT's uncased
            English vocab); checked against the reader's.
        hidden_size: the width of every layer (default: the preset's); a multiple of the heads.
        num_hidden_layers: the encoder layers (default: the preset's).
        num_attention_heads: the attention heads per layer (default: the preset's).
        intermediate_size: the width of the feed-forward layer (default: 4 x hidden_size).
        hidden_act: the feed-forward activation: `gelu` (exact erf, BERT's), `gelu_new` (tanh
            approximation), `relu`, `tanh`.
        hidden_dropout_prob: dropout on the embeddings and on each sublayer's output.
        attention_probs_dropout_prob: dropout on the attention weights.
        max_position_embeddings: the longest sequence the position embedding holds (512 in the
            released models); a longer batch is an error.
        type_vocab_size: the segment types (2: sentence A and B).
        layer_norm_eps: the epsilon of every LayerNorm (1e-12 in BERT).
        initializer_range: the std of the normal initialisation of the weights (0.02).
        pad_token_id: the id that marks padding when the batch has no `input_ids_mask`.
        recompute: activation checkpointing: re-run each encoder layer's forward in the backward
            instead of keeping its activations (less memory, about one more forward of time).
    """

    head_keys, foreign_keys = (), ()   # the task's own, set by each task model

    def _build_bert(self, args):
        args = {k: v for k, v in args.items() if k not in ("self", "__class__", "num_classes", "dropout")}
        self.bert = BertModel(**args)
        self.config = self.bert.config

    def weights(self):
        """The PaddleNLP releases are pretraining files; Hugging Face checkpoints (BertModel files and
        task files, with or without the `bert.` prefix) are layouts that are not downloadable entries."""
        return Weights(head_keys=list(self.head_keys), foreign_keys=list(self.foreign_keys),
                       layout_models=["BertForPretraining"], layouts=[hf_layout("bert.")])

    def check_weights_config(self, config, vocab_rows, folder):
        check_hf_config(config, vocab_rows, folder, self.config)

    def data_agreement(self):
        """The vocabulary and the longest input the position table takes."""
        return DataAgreement(vocab_size=self.config["vocab_size"],
                             max_seq_length=self.config["max_position_embeddings"])

    def _export_inputs(self, extra=()):
        """The padded token batch (any batch size and length) and, for the predictor, the longest
        sequence the position table takes."""
        inputs = {k: InputSpec([None, None], "int64") for k in ("input_ids", "token_type_ids")}
        inputs["input_ids_mask"] = InputSpec([None, None], "float32")
        inputs.update({k: InputSpec([None, None], "int64") for k in extra})
        longest = self.config["max_position_embeddings"]
        why = f"BERT's position table holds {longest} positions (max_position_embeddings)"
        return inputs, {k: ([None, longest], why) for k in ("input_ids", "token_type_ids", "input_ids_mask")}


@MODELS.register("BertForPretraining")
class BertForPretraining(_BertTask):
    """Masked LM (decoder tied to the word embeddings, logits only at the masked positions) + NSP.

    Batch: input_ids, token_type_ids, input_ids_mask [B, S]; masked_lm_positions [B, P] and
    masked_lm_ids [B, P] (padded with -1); next_sentence_label [B] (0: B follows A, 1: random).
    Loss (PaddleNLP BertPretrainingCriterion): mean MLM cross-entropy over the masked tokens of the
    batch + mean NSP cross-entropy. Eval mode adds per-sample MLM hit counts and the NSP logits.
    """

    foreign_keys = [r"classifier\..*"]

    def __init__(self, size: typing.Literal[tuple(SIZES)] = "base", vocab_size: int = 30522, hidden_size: int = None,
                 num_hidden_layers: int = None, num_attention_heads: int = None, intermediate_size: int = None,
                 hidden_act: typing.Literal[ACTIVATIONS] = "gelu", hidden_dropout_prob: float = 0.1,
                 attention_probs_dropout_prob: float = 0.1, max_position_embeddings: int = 512,
                 type_vocab_size: int = 2, layer_norm_eps: float = 1e-12, initializer_range: float = 0.02,
                 pad_token_id: int = 0, recompute: bool = False):
        super().__init__()
        self._build_bert(dict(locals()))
        self.cls = PretrainingHeads(self.config)
        if not _lazy():
            _init_weights(self.cls, self.config["initializer_range"])

    def export_spec(self, example=None):
        """The eval predictions PretrainingScores and the Pretraining metric read; the losses need
        next_sentence_label, which inference has not."""
        inputs, longest = self._export_inputs(("masked_lm_positions", "masked_lm_ids"))
        return {"inputs": inputs, "outputs": ["mlm_correct", "mlm_total", "nsp_logits"], "max_shape": longest}

    def heads(self, sequence_output, pooled, flat_positions):
        """MLM logits at `flat_positions` (indices into [B*S]) and NSP logits."""
        H = sequence_output.shape[-1]
        hidden = paddle.gather(sequence_output.reshape([-1, H]), flat_positions)
        return self.cls.predictions(hidden, self.bert.embeddings.word_embeddings.weight), \
            self.cls.seq_relationship(pooled)

    def forward(self, batch):
        ids, types, mask = bert_inputs(batch)
        for key in ("masked_lm_positions", "masked_lm_ids"):
            if key not in batch:
                raise ConfigError(f"BertForPretraining: the batch has no '{key}' (keys: {', '.join(sorted(batch))})")
        seq, pooled = self.bert(ids, types, mask)
        B, S = ids.shape
        positions = _tensor(batch["masked_lm_positions"]).astype("int64")
        labels = _tensor(batch["masked_lm_ids"]).astype("int64")
        # Every slot of [B, P] goes through the head, the padded ones (label < 0) with weight 0: fixed
        # shapes, so the step never waits for the device to count the masked tokens (masked_select
        # would, on a GPU). The padding is the few slots under max_predictions_per_seq.
        valid = (labels >= 0).astype("float32")
        flat = (positions + paddle.arange(B, dtype="int64").unsqueeze(1) * S).reshape([-1])
        target = paddle.where(labels >= 0, labels, paddle.zeros_like(labels)).reshape([-1, 1])
        mlm_logits, nsp_logits = self.heads(seq, pooled, flat)
        n = paddle.clip(valid.sum(), min=1.0)   # a tensor: exported programs trace this
        mlm_loss = (softmax_ce(mlm_logits, target).reshape([-1]) * valid.reshape([-1])).sum() / n
        out = {"mlm_loss": mlm_loss}
        loss = mlm_loss
        if "next_sentence_label" in batch:
            nsp_label = _tensor(batch["next_sentence_label"]).astype("int64").reshape([-1, 1])
            out["nsp_loss"] = softmax_ce(nsp_logits, nsp_label).mean()
            loss = loss + out["nsp_loss"]
        out["loss"] = loss
        if self.training:
            return out
        hit = (mlm_logits.argmax(axis=-1) == target.reshape([-1])).astype("float32")
        hit = paddle.reshape(hit, paddle.shape(labels)) * valid     # [B, P]; B and P may be dynamic (export)
        out.update(mlm_correct=hit.sum(axis=1), mlm_total=valid.sum(axis=1), nsp_logits=nsp_logits)
        return out


class LMPredictionHead(nn.Layer):
    def __init__(self, cfg):
        super().__init__()
        self.transform = nn.Linear(cfg["hidden_size"], cfg["hidden_size"])
        self.act = _activation(cfg["hidden_act"])
        self.layer_norm = nn.LayerNorm(cfg["hidden_size"], epsilon=cfg["layer_norm_eps"])
        self.decoder_bias = self.create_parameter([cfg["vocab_size"]], is_bias=True,
                                                  default_initializer=nn.initializer.Constant(0.0))

    def forward(self, hidden, decoder_weight):
        h = self.layer_norm(self.act(self.transform(hidden)))
        return ops.matmul(h, decoder_weight, transpose_y=True) + self.decoder_bias


class PretrainingHeads(nn.Layer):
    def __init__(self, cfg):
        super().__init__()
        self.predictions = LMPredictionHead(cfg)
        self.seq_relationship = nn.Linear(cfg["hidden_size"], 2)


@MODELS.register("BertForSequenceClassification")
class BertForSequenceClassification(_BertTask):
    """[CLS] pooled output -> dropout -> Linear(num_classes): cross-entropy, or with num_classes 1
    regression with a mean squared error (STS-B). Eval mode: {'logits'} (+ 'loss' with labels).

    Args:
        num_classes: the outputs of the classifier: the task's classes, or 1 for a regression (STS-B);
            checked against the reader's.
        dropout: the dropout before the classifier (default: hidden_dropout_prob).
    """

    head_keys = [r"classifier\.(weight|bias)"]
    foreign_keys = [r"cls\..*"]            # the pretraining heads of a pretraining file: dropped, logged

    def __init__(self, num_classes: int = 2, size: typing.Literal[tuple(SIZES)] = "base", vocab_size: int = 30522,
                 hidden_size: int = None, num_hidden_layers: int = None, num_attention_heads: int = None,
                 intermediate_size: int = None, hidden_act: typing.Literal[ACTIVATIONS] = "gelu",
                 hidden_dropout_prob: float = 0.1,
                 attention_probs_dropout_prob: float = 0.1, max_position_embeddings: int = 512,
                 type_vocab_size: int = 2, layer_norm_eps: float = 1e-12, initializer_range: float = 0.02,
                 pad_token_id: int = 0, recompute: bool = False, dropout: float = None):
        super().__init__()
        if num_classes < 1:
            raise ConfigError(f"BertForSequenceClassification: num_classes must be >= 1, got {num_classes}")
        self._build_bert(dict(locals()))
        self.num_classes = num_classes
        self.dropout = nn.Dropout(self.config["hidden_dropout_prob"] if dropout is None else dropout)
        self.classifier = nn.Linear(self.config["hidden_size"], num_classes)
        if not _lazy():
            _init_weights(self.classifier, self.config["initializer_range"])

    def data_agreement(self):
        return dataclasses.replace(super().data_agreement(), num_classes=self.num_classes)

    def export_spec(self, example=None):
        """`logits`, what the GLUE metric and the GLUESubmission writer read."""
        inputs, longest = self._export_inputs()
        return {"inputs": inputs, "outputs": ["logits"], "max_shape": longest}

    def forward(self, batch):
        ids, types, mask = bert_inputs(batch)
        _, pooled = self.bert(ids, types, mask)
        logits = self.classifier(self.dropout(pooled))
        out = {} if self.training else {"logits": logits}
        if "label" in batch:
            label = _tensor(batch["label"])
            if self.num_classes == 1:
                out["loss"] = F.mse_loss(logits.reshape([-1]), label.astype(logits.dtype).reshape([-1]))
            else:
                out["loss"] = softmax_ce(logits, label.astype("int64").reshape([-1, 1])).mean()
        elif self.training:
            raise ConfigError("BertForSequenceClassification: training needs 'label' in the batch")
        return out
