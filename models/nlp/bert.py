"""BERT (Devlin et al. 2018): BertModel, BertForPretraining (MLM + NSP), BertForSequenceClassification.

Architecture facts (PaddleNLP `transformers/bert/modeling.py`, HF `modeling_bert.py`): embeddings
(word + position + token type, LayerNorm, dropout), post-LN encoder layers (self-attention, add &
LayerNorm, FFN with exact erf GELU, add & LayerNorm; no dropout after the activation), a tanh pooler
on [CLS]; LayerNorm epsilon 1e-12; weights N(0, 0.02). Parameter names are PaddleNLP's (>= 2.5),
so its files load with no renaming; the legacy (<= 2.4) files differ only in alias keys of the tied
MLM decoder, dropped by the entries below. Hugging Face checkpoints load through the `huggingface`
layout (renames + Linear transposes), also from a folder with config.json and model.safetensors.

The encoder layer is built from the layer package's blocks (ops/: one GEMM for q, k, v, fused
attention, add & norm), which run fused kernels in training on the CPU and plain paddle ops
otherwise. Attention is swappable with `set_attention(fn)`; the default is matmul(q, k^T) + additive
mask, softmax, dropout, matmul: on our CPUs this beats `F.scaled_dot_product_attention`.
`recompute: true` re-runs each encoder layer's forward during backward instead of keeping its
activations (activation checkpointing): the same gradients, with dropout too, for less memory.

`load_bert(folder_or_entry)` and `sentence_embeddings(...)` are the small Python API for use
outside the tools.
"""
import dataclasses
import json
import os
import warnings

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.static import InputSpec

import ops
from engine.model import DataAgreement, Weights, ZooModel
from engine.pretrained import WEIGHTS, PretrainedEntry
from engine.registry import MODELS, ConfigError

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
                from paddle.distributed.fleet.utils import recompute
                x = recompute(layer, x, bias)   # restores the RNG state: the same dropout masks
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
    """Shared by the task models: the encoder under `bert.`, and the layouts their files come in."""

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

    def __init__(self, size: str = "base", vocab_size: int = 30522, hidden_size: int = None,
                 num_hidden_layers: int = None, num_attention_heads: int = None, intermediate_size: int = None,
                 hidden_act: str = "gelu", hidden_dropout_prob: float = 0.1,
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
        valid = labels >= 0
        flat = positions + paddle.arange(B, dtype="int64").unsqueeze(1) * S
        sel = paddle.masked_select(flat, valid)
        target = paddle.masked_select(labels, valid)
        mlm_logits, nsp_logits = self.heads(seq, pooled, sel)
        n = paddle.clip(valid.astype("float32").sum(), min=1.0)   # a tensor: exported programs trace this
        mlm_loss = softmax_ce(mlm_logits, target.unsqueeze(1)).sum() / n
        out = {"mlm_loss": mlm_loss}
        loss = mlm_loss
        if "next_sentence_label" in batch:
            nsp_label = _tensor(batch["next_sentence_label"]).astype("int64").reshape([-1, 1])
            out["nsp_loss"] = softmax_ce(nsp_logits, nsp_label).mean()
            loss = loss + out["nsp_loss"]
        out["loss"] = loss
        if self.training:
            return out
        hit = (mlm_logits.argmax(axis=-1) == target).astype("float32")
        owner = paddle.masked_select(paddle.arange(B, dtype="int64").unsqueeze(1).expand_as(positions), valid)
        zeros = paddle.zeros([B], dtype=hit.dtype)
        out.update(mlm_correct=paddle.scatter(zeros, owner, hit, overwrite=False),   # summed per sample
                   mlm_total=valid.astype("float32").sum(axis=1), nsp_logits=nsp_logits)
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
    regression with a mean squared error (STS-B). Eval mode: {'logits'} (+ 'loss' with labels)."""

    head_keys = [r"classifier\.(weight|bias)"]
    foreign_keys = [r"cls\..*"]            # the pretraining heads of a pretraining file: dropped, logged

    def __init__(self, num_classes: int = 2, size: str = "base", vocab_size: int = 30522, hidden_size: int = None,
                 num_hidden_layers: int = None, num_attention_heads: int = None, intermediate_size: int = None,
                 hidden_act: str = "gelu", hidden_dropout_prob: float = 0.1,
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


# ------------------------------------------------------------------------------------- weights
# PaddleNLP's released files (model_state of BertForPretraining, legacy <= 2.4 names): the tied MLM
# decoder appears as cls.predictions.decoder_weight (an alias of the word embeddings) and, in files
# saved by >= 2.5, as cls.predictions.decoder.weight/.bias (aliases of word embeddings / decoder_bias).
def _drop_decoder_bias_alias(state):
    state = dict(state)
    alias = state.pop("cls.predictions.decoder.bias", None)
    if alias is not None:
        state.setdefault("cls.predictions.decoder_bias", alias)
    return state


PADDLENLP_IGNORE = [r"cls\.predictions\.decoder_weight", r"cls\.predictions\.decoder\.weight"]
PADDLENLP_ARGS = {"bert-base-uncased": dict(size="base", vocab_size=30522),
                  "bert-large-uncased": dict(size="large", vocab_size=30522),
                  "bert-base-cased": dict(size="base", vocab_size=28996),
                  "bert-base-chinese": dict(size="base", vocab_size=21128)}
PADDLENLP_URLS = {  # PaddleNLP transformers/bert/modeling.py BertPretrainedModel.pretrained_resource_files_map
    "bert-base-uncased": "https://bj.bcebos.com/paddlenlp/models/transformers/bert-base-uncased.pdparams",
    "bert-large-uncased": "https://bj.bcebos.com/paddlenlp/models/transformers/bert-large-uncased.pdparams",
    "bert-base-cased": "http://bj.bcebos.com/paddlenlp/models/transformers/bert/bert-base-cased.pdparams",
    "bert-base-chinese": "http://bj.bcebos.com/paddlenlp/models/transformers/bert/bert-base-chinese.pdparams",
}
PADDLENLP_PARAMS = {"bert-base-uncased": 110106428, "bert-large-uncased": 336226108,
                    "bert-base-cased": 108932934, "bert-base-chinese": 102882442}
GLUE_SOURCE = "PaddleNLP model_zoo/bert/README.md (dev sets; lr 2e-5, batch 32, 3 epochs, seq 128)"

for _name, _url in PADDLENLP_URLS.items():
    WEIGHTS.add(PretrainedEntry(
        name=_name,
        model="BertForPretraining",
        urls=[_url],
        source="PaddleNLP BertForPretraining model_state .pdparams (names of PaddleNLP <= 2.4)",
        ignore_keys=PADDLENLP_IGNORE,
        convert=_drop_decoder_bias_alias,
        model_args=PADDLENLP_ARGS[_name],
        num_params=PADDLENLP_PARAMS[_name],
        metrics=({"accuracy": 0.9266} if _name == "bert-base-uncased" else {}),
        metrics_source=(GLUE_SOURCE + "; SST-2 accuracy, fine-tuned" if _name == "bert-base-uncased" else ""),
        dataset=("GLUE SST-2 dev" if _name == "bert-base-uncased" else ""),
        config=("configs/nlp/bert/bert_base_3e_glue_sst2.yaml" if _name == "bert-base-uncased" else ""),
        notes="PaddleNLP says these were converted from huggingface/transformers; the BOS links have "
              "failed before (PaddleNLP#9833): a Hugging Face folder (config.json, vocab.txt, "
              "model.safetensors) loads too. The vocab.txt is not part of this file.",
        reproduced=("PaddleNLP-named golden weights reproduce the reference pooled, MLM and NSP outputs "
                    "(tests); the file itself was not downloaded here" if _name == "bert-base-uncased"
                    else "same key names as bert-base-uncased, whose PaddleNLP table is tested; not downloaded here"),
    ))


def hf_layout(prefix):
    """Hugging Face BERT names -> ours; `prefix` is where our encoder sits ('' or 'bert.').

    HF files of BertModel have no prefix, task files have `bert.`; both load. Linear weights are
    [out, in] there and [in, out] here; old TF-converted files say LayerNorm.gamma/beta.
    """
    P = prefix
    enc = r"(?:bert\.)?encoder\.layer\.(\d+)\."
    norm = r"(weight|bias|gamma|beta)"
    key_map = [
        (r"(?:bert\.)?embeddings\.(word|position|token_type)_embeddings\.weight", P + r"embeddings.\1_embeddings.weight"),
        (r"(?:bert\.)?embeddings\.LayerNorm\." + norm, P + r"embeddings.layer_norm.\1"),
        (enc + r"attention\.self\.query\.(weight|bias)", P + r"encoder.layers.\1.self_attn.q_proj.\2"),
        (enc + r"attention\.self\.key\.(weight|bias)", P + r"encoder.layers.\1.self_attn.k_proj.\2"),
        (enc + r"attention\.self\.value\.(weight|bias)", P + r"encoder.layers.\1.self_attn.v_proj.\2"),
        (enc + r"attention\.output\.dense\.(weight|bias)", P + r"encoder.layers.\1.self_attn.out_proj.\2"),
        (enc + r"attention\.output\.LayerNorm\." + norm, P + r"encoder.layers.\1.norm1.\2"),
        (enc + r"intermediate\.dense\.(weight|bias)", P + r"encoder.layers.\1.linear1.\2"),
        (enc + r"output\.dense\.(weight|bias)", P + r"encoder.layers.\1.linear2.\2"),
        (enc + r"output\.LayerNorm\." + norm, P + r"encoder.layers.\1.norm2.\2"),
        (r"(?:bert\.)?pooler\.dense\.(weight|bias)", P + r"pooler.dense.\1"),
        (r"cls\.predictions\.transform\.dense\.(weight|bias)", r"cls.predictions.transform.\1"),
        (r"cls\.predictions\.transform\.LayerNorm\." + norm, r"cls.predictions.layer_norm.\1"),
        (r"cls\.predictions\.bias", r"cls.predictions.decoder_bias"),
        (r"cls\.seq_relationship\.(weight|bias)", r"cls.seq_relationship.\1"),
        (r"classifier\.(weight|bias)", r"classifier.\1"),
    ]
    return PretrainedEntry(
        name="huggingface", model="", urls=[],
        source="Hugging Face BERT checkpoint (BertModel / BertForPreTraining / BertForSequenceClassification)",
        key_map=key_map,
        # position_ids is a buffer; the decoder is tied to the word embeddings and its bias to predictions.bias
        ignore_keys=[r"(?:bert\.)?embeddings\.position_ids", r"cls\.predictions\.decoder\.(weight|bias)"],
        convert=_hf_convert)


def _hf_convert(state):
    out = {}
    for key, value in state.items():
        key = key[:-len("gamma")] + "weight" if key.endswith(".gamma") else key
        key = key[:-len("beta")] + "bias" if key.endswith(".beta") else key
        value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if value.ndim == 2 and "embeddings" not in key:
            value = value.T                  # Linear: [out, in] -> [in, out]
        out[key] = value
    return out


def task_file_layout():
    """Our (and PaddleNLP's) task-model files read by the bare encoder: `bert.` taken off; the heads
    left are BertModel's foreign keys."""
    return PretrainedEntry(name="task-model", model="", urls=[], source="a BERT task model's file (bert.* keys)",
                           key_map=[(r"bert\.(.*)", r"\1")], ignore_keys=PADDLENLP_IGNORE)



# ------------------------------------------------------------------------------------- Python API
HF_TO_ARGS = {k: k for k in CONFIG_KEYS + ("hidden_dropout_prob", "attention_probs_dropout_prob",
                                           "initializer_range", "pad_token_id")}
TASKS = {"encoder": BertModel, "pretraining": BertForPretraining,
         "classification": BertForSequenceClassification}


def load_bert(name_or_folder, task="encoder", log=None, **overrides):
    """A BERT with weights, in eval mode: from a Hugging Face folder (config.json + model.safetensors),
    one of our checkpoints or `.pdparams` files (give the settings in `overrides`), or an entry name.

    `task`: 'encoder' (BertModel), 'pretraining' or 'classification' (pass num_classes=...).
    """
    from engine.pretrained import load_pretrained, read_folder_config

    if task not in TASKS:
        raise ConfigError(f"load_bert: task '{task}' unknown; known: {', '.join(TASKS)}")
    args = {}
    spec = os.fspath(name_or_folder)
    if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "config.json")):
        cfg, _ = read_folder_config(spec)
        check_model_type(cfg, spec)
        args = {HF_TO_ARGS[k]: v for k, v in cfg.items() if k in HF_TO_ARGS}
    elif spec in WEIGHTS:
        args = dict(WEIGHTS.get(spec).model_args)
    args.update(overrides)
    log = log or (lambda *a: None)
    if task == "encoder" and spec in WEIGHTS:   # the releases are pretraining files: take their encoder
        model = BertForPretraining(**args)
        load_pretrained(model, spec, strict=True, log=log)
        return model.bert.eval()
    model = TASKS[task](**args)
    load_pretrained(model, spec, strict=task == "encoder", log=log)
    model.eval()
    return model


def load_tokenizer(folder):
    """The WordPiece tokenizer of a Hugging Face folder (vocab.txt; lower-case unless its
    tokenizer_config.json says do_lower_case: false)."""
    from readers.tokenization import BertTokenizer

    lowercase = True
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            lowercase = bool(json.load(f).get("do_lower_case", True))
    return BertTokenizer(os.path.join(folder, "vocab.txt"), lowercase=lowercase)


@paddle.no_grad()
def sentence_embeddings(model, tokenizer, sentences, max_seq_length=256, normalize=True):
    """Mean of the last hidden states over the real tokens, L2-normalised (sentence-transformers'
    Transformer -> Pooling(mean) -> Normalize). Returns numpy [N, hidden]."""
    encoded = [tokenizer.encode(s, max_seq_length=max_seq_length)[0] for s in sentences]
    T = max(len(e) for e in encoded)
    ids = np.full((len(encoded), T), tokenizer.pad_id, np.int64)
    mask = np.zeros((len(encoded), T), np.float32)
    for i, e in enumerate(encoded):
        ids[i, :len(e)], mask[i, :len(e)] = e, 1.0
    model.eval()
    bert = model if isinstance(model, BertModel) else model.bert
    seq, _ = bert(paddle.to_tensor(ids), paddle.zeros([len(encoded), T], "int64"), paddle.to_tensor(mask))
    m = paddle.to_tensor(mask).unsqueeze(-1)
    mean = (seq * m).sum(axis=1) / paddle.clip(m.sum(axis=1), min=1e-9)
    if normalize:
        mean = mean / paddle.clip(paddle.linalg.norm(mean, axis=1, keepdim=True), min=1e-12)
    return mean.numpy()
