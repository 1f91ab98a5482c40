"""Encoder-decoder Transformer for translation ("Attention is all you need"), laid out and named as
PaddleNLP's `TransformerModel` so its released WMT14 en-de weights load without renaming.

Facts carried over from PaddleNLP (`paddlenlp/transformers/transformer/modeling.py`,
`examples/machine_translation/transformer/`): word embeddings scaled by sqrt(d_model), initialised
Normal(0, d_model**-0.5), with `padding_idx` = the pad id (0 = `<s>` there, so `<s>` embeds to zeros);
a sinusoid table in an `nn.Embedding` (tensor2tensor layout: sin in the first half of the channels,
cos in the second) whose output is stop-gradient, so it is a parameter that never changes; pad
positions get position 0; pre-norm layers (`normalize_before`) or the paper's post-norm; a LayerNorm
after each stack (`final_norm`): paddle.nn.Transformer builds one in both modes, PaddleNLP's
TransformerModel only with pre-norm (its post-norm passes stacks without one as custom_encoder /
custom_decoder), so a PaddleNLP post-norm file loads with `final_norm: false` (the paper's post-norm
exactly; see `Transformer`); weight sharing ties source and target embeddings and the output
projection (`logits = h @ E^T`); label-smoothed cross entropy over the non-pad tokens,
q = (1 - eps) * one_hot + eps / V.

Decoding is incremental: the encoder runs once per batch, the cross-attention keys/values of each
decoder layer are projected once, and the self-attention keys/values of the tokens already generated
are cached and extended by one row per step (`use_cache: false` recomputes the whole decoder
prefix every step instead: the same tokens, kept for tests and the benchmark). Two searches
(`beam_search_version`):
- `v1` (default): PaddleNLP's default, its InferTransformerModel with beam_search_version v1, i.e.
  paddle.nn.BeamSearchDecoder under paddle.nn.dynamic_decode(max_step_num=max_out_len) (`BeamSearch.v1`
  says how; a test compares the two token for token). Its published BLEU (26.89 base, 27.48 big) was
  decoded so, with beam 5. Scores are summed log-probabilities, no length penalty; at most
  max_out_len + 1 tokens (default: the position table, max_length - 1, as PaddleNLP's recipes).
- `length_penalty`: this zoo's earlier search. It keeps the `beam_size` best unfinished hypotheses
  among the 2 x beam_size best candidates of a step; an end-of-sentence candidate ranked inside the
  first `beam_size` is finished with the GNMT length penalty, score = sum(log p) / ((5 + |Y|) / 6) **
  alpha (|Y| counts the tokens generated, `<e>` included), and a sentence stops once it has
  `beam_size` finished hypotheses or reaches its maximum length `max_len_a * |source| + max_len_b`
  (capped by the position table). With beam_size 1 this is exactly greedy decoding. It is not
  PaddleNLP's v2 (alive and finished queues of beam_size each, tensor2tensor's early stop).

Export (tools/export.py): the networks are two programs, `encoder` (source -> the memory's
cross-attention keys/values per decoder layer and the memory bias) and `decoder_step` (one cached
step: the last tokens, the memory's keys/values and the self-attention cache of the positions so far
-> log-probabilities of the next token and the cache extended by one position; the position is the
cache's length). The search itself (hypothesis bookkeeping, scores, stopping) stays Python:
`BeamSearch`, the one the dynamic model runs, drives those programs through `Transformer.exported_runner`,
so both paths decode with the same code and differ only in who computes a step. The source-length
check against the position table runs in Python on both paths.
"""
import math
import typing

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.static import InputSpec

import ops
from engine.model import DataAgreement, ZooModel, recomputed
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry

NEG = -1e9   # additive attention bias of masked positions

# the paper's two sizes (PaddleNLP configs/transformer.{base,big}.yaml)
PRESETS = {
    "base": {"d_model": 512, "d_inner_hid": 2048, "n_head": 8, "num_encoder_layers": 6, "num_decoder_layers": 6},
    "big": {"d_model": 1024, "d_inner_hid": 4096, "n_head": 16, "num_encoder_layers": 6, "num_decoder_layers": 6},
}


def position_encoding_init(n_position, d_pos_vec):
    """The sinusoid table [n_position, d_pos_vec] (tensor2tensor's timescales, PaddleNLP's values)."""
    channels = d_pos_vec
    num_timescales = channels // 2
    log_increment = math.log(1e4) / max(num_timescales - 1, 1)
    inv_timescales = np.exp(np.arange(num_timescales) * -log_increment)
    scaled = np.arange(n_position)[:, None] * inv_timescales[None, :]
    signal = np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)
    signal = np.pad(signal, [[0, 0], [0, channels % 2]])
    return signal.astype("float32")


def length_penalty(length, alpha):
    """GNMT: ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


# the values of `beam_search_version` (module docstring); PaddleNLP's "v2" is not one of them
SEARCHES = ("v1", "length_penalty")


def search_options(version, max_out_len, alpha, max_len_a, max_len_b, max_length):
    """(version, max_out_len, alpha, max_len_a, max_len_b) with the chosen search's defaults; a key of
    the other search is refused, so that an override never silently does nothing."""
    if version not in SEARCHES:
        raise ConfigError(f"Transformer: model.beam_search_version {version!r} is not one of {', '.join(SEARCHES)}")
    if version == "v1":
        given = [k for k, v in (("alpha", alpha), ("max_len_a", max_len_a), ("max_len_b", max_len_b)) if v is not None]
        if given:
            raise ConfigError(f"Transformer: model.{given[0]} applies to beam_search_version: length_penalty only "
                              f"(v1 has no length penalty and stops at model.max_out_len)")
        # the whole position table, as PaddleNLP's recipes (max_out_len = max_length, table max_length + 1:
        # base 256, big 1024); v1 makes up to max_out_len + 1 tokens
        max_out_len = max_length - 1 if max_out_len is None else max_out_len
        if not 0 <= max_out_len < max_length:
            raise ConfigError(f"Transformer: model.max_out_len {max_out_len} must be in [0, model.max_length - 1 = "
                              f"{max_length - 1}] (v1 makes up to max_out_len + 1 tokens, one position each)")
        return version, max_out_len, None, None, None
    if max_out_len is not None:
        raise ConfigError("Transformer: model.max_out_len applies to beam_search_version: v1 only (length_penalty "
                          "stops at model.max_len_a * |source| + model.max_len_b)")
    return (version, None, 0.6 if alpha is None else alpha, 1.0 if max_len_a is None else max_len_a,
            50 if max_len_b is None else max_len_b)


class WordEmbedding(nn.Layer):
    def __init__(self, vocab_size, emb_dim, pad_id):
        super().__init__()
        self.emb_dim = emb_dim
        self.word_embedding = nn.Embedding(
            vocab_size, emb_dim, padding_idx=pad_id,
            weight_attr=paddle.ParamAttr(initializer=nn.initializer.Normal(0.0, emb_dim ** -0.5)))

    def forward(self, ids):
        return self.word_embedding(ids) * (self.emb_dim ** 0.5)


class PositionalEmbedding(nn.Layer):
    def __init__(self, emb_dim, max_length):
        super().__init__()
        self.pos_encoder = nn.Embedding(
            max_length, emb_dim,
            weight_attr=paddle.ParamAttr(initializer=nn.initializer.Assign(position_encoding_init(max_length, emb_dim))))

    def forward(self, pos):
        out = self.pos_encoder(pos)
        out.stop_gradient = True   # the table is a parameter, but it never learns (as PaddleNLP)
        return out


def _split_heads(x, n_head, parts=1):
    """[B, T, parts * D] -> `parts` tensors [B, H, T, dh]."""
    b, t, d = x.shape
    x = x.reshape([b, t, parts, n_head, d // (parts * n_head)]).transpose([2, 0, 3, 1, 4])
    return [x[i] for i in range(parts)] if parts > 1 else x[0]


def _merge_heads(x):
    b, h, t, dh = x.shape
    return x.transpose([0, 2, 1, 3]).reshape([b, t, h * dh])


class MultiHeadAttention(nn.Layer):
    """Scaled dot-product attention over `n_head` heads; q/k/v/out projections named as paddle.nn's."""

    def __init__(self, d_model, n_head, dropout):
        super().__init__()
        if d_model % n_head:
            raise ConfigError(f"Transformer: d_model {d_model} is not a multiple of n_head {n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def project_kv(self, x):
        """Keys and values [B, H, T, dh] of `x` (a decoder projects the memory once)."""
        return _split_heads(ops.linear(x, [self.k_proj, self.v_proj]), self.n_head, 2)

    def project_qkv(self, x):
        return _split_heads(ops.linear(x, [self.q_proj, self.k_proj, self.v_proj]), self.n_head, 3)

    def attend(self, q, k, v, bias=None):
        return ops.linear(_merge_heads(ops.attention(q, k, v, bias, self.dropout, self.training)), self.out_proj)

    def forward(self, query, kv, bias=None):
        """Attention of `query` [B, T, D] over precomputed keys/values (cross-attention)."""
        return self.attend(_split_heads(ops.linear(query, self.q_proj), self.n_head), kv[0], kv[1], bias)

    def self_attention(self, x, bias=None, cache=None):
        """`cache`: None, or a dict {"k", "v"} of the earlier positions' keys/values, extended in place."""
        q, k, v = self.project_qkv(x)
        if cache is not None:
            if "k" in cache:
                k, v = paddle.concat([cache["k"], k], axis=2), paddle.concat([cache["v"], v], axis=2)
            cache["k"], cache["v"] = k, v
        return self.attend(q, k, v, bias)


class _Sublayers(nn.Layer):
    """Residual blocks with pre-norm (x + f(norm(x))) or post-norm (norm(x + f(x)))."""

    def _block(self, x, norm, fn):
        if self.normalize_before:
            return ops.add(fn(ops.layer_norm(x, norm)), x, self.dropout, self.training)
        return ops.add_norm(fn(x), x, norm, self.dropout, self.training)

    def _ffn(self, x):
        return ops.linear(ops.linear(x, self.linear1, "relu", self.act_dropout, self.training), self.linear2)


class EncoderLayer(_Sublayers):
    def __init__(self, d_model, n_head, d_inner_hid, dropout, attn_dropout, act_dropout, normalize_before):
        super().__init__()
        self.normalize_before, self.dropout, self.act_dropout = normalize_before, dropout, act_dropout
        self.self_attn = MultiHeadAttention(d_model, n_head, attn_dropout)
        self.linear1 = nn.Linear(d_model, d_inner_hid)
        self.linear2 = nn.Linear(d_inner_hid, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, bias):
        x = self._block(x, self.norm1, lambda h: self.self_attn.self_attention(h, bias))
        return self._block(x, self.norm2, self._ffn)


class DecoderLayer(_Sublayers):
    def __init__(self, d_model, n_head, d_inner_hid, dropout, attn_dropout, act_dropout, normalize_before):
        super().__init__()
        self.normalize_before, self.dropout, self.act_dropout = normalize_before, dropout, act_dropout
        self.self_attn = MultiHeadAttention(d_model, n_head, attn_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_head, attn_dropout)
        self.linear1 = nn.Linear(d_model, d_inner_hid)
        self.linear2 = nn.Linear(d_inner_hid, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, x, memory_kv, self_bias, memory_bias, cache=None):
        """`cache`: None (whole prefix at once, causal `self_bias`) or a dict {"k", "v"} of the keys and
        values of the positions before `x`, extended in place with those of `x`."""
        x = self._block(x, self.norm1, lambda h: self.self_attn.self_attention(h, self_bias, cache))
        x = self._block(x, self.norm2, lambda h: self.cross_attn(h, memory_kv, memory_bias))
        return self._block(x, self.norm3, self._ffn)


class _Stack(nn.Layer):
    """The layers of the encoder or decoder; with `recompute`, each layer's activations are recomputed
    during a training backward instead of kept (never in decoding, which has no backward)."""

    def __init__(self, layer_class, num_layers, final_norm, d_model, recompute=False, **layer_args):
        super().__init__()
        self.layers = nn.LayerList([layer_class(d_model=d_model, **layer_args) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(d_model) if final_norm else None
        self.recompute = recompute

    def run_layers(self, x, *args):
        """The layers on `x`; an argument given as a list has one entry per layer (memory_kv, caches)."""
        remat = self.recompute and self.training and paddle.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            per_layer = [a[i] if isinstance(a, list) else a for a in args]
            x = recomputed(layer, x, *per_layer) if remat else layer(x, *per_layer)
        return self.norm(x) if self.norm is not None else x


class Encoder(_Stack):
    def __init__(self, num_layers, final_norm, d_model, recompute=False, **layer_args):
        super().__init__(EncoderLayer, num_layers, final_norm, d_model, recompute, **layer_args)

    def forward(self, x, bias):
        return self.run_layers(x, bias)


class Decoder(_Stack):
    def __init__(self, num_layers, final_norm, d_model, recompute=False, **layer_args):
        super().__init__(DecoderLayer, num_layers, final_norm, d_model, recompute, **layer_args)

    def memory_kv(self, memory):
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    def forward(self, x, memory_kv, self_bias, memory_bias, caches=None):
        return self.run_layers(x, memory_kv, self_bias, memory_bias, caches)


class _Body(nn.Layer):
    """Holds `encoder` and `decoder` so that parameter names read `transformer.encoder...` (PaddleNLP)."""

    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder


@MODELS.register("Transformer")
class Transformer(ZooModel):
    """Encoder-decoder Transformer; defaults are the base model with PaddleNLP's WMT14 en-de layout
    (pre-norm, shared 33712-entry vocabulary, position table of 257 = max_length 256 + 1).

    The LayerNorm after each stack (`final_norm`; keys `transformer.{encoder,decoder}.norm.*`):
    paddle.nn.Transformer builds it with pre-norm and post-norm layers alike (Paddle
    python/paddle/nn/layer/transformer.py, `Transformer.__init__`: `encoder_norm = LayerNorm(d_model)`
    whatever `normalize_before`); PaddleNLP's TransformerModel has it only with pre-norm (its released
    models): with `normalize_before=False` it hands paddle.nn.Transformer its own TransformerEncoder /
    TransformerDecoder stacks built without a norm (paddlenlp/transformers/transformer/modeling.py,
    `encoder_with_post_norm`, in 2.8.1). So a PaddleNLP post-norm file needs `final_norm: false`,
    which is also the paper's post-norm; a strict load that misses only these keys says so
    (`weights_hint`).

    Batch keys: `src_ids` [B, S] (source tokens + `<e>`), `tgt_in` [B, T] (`<s>` + target) and
    `tgt_out` [B, T] (target + `<e>`), padded with `pad_id`, with the `<key>_mask` a PadSequences
    collate adds. Train mode returns {loss (label-smoothed, per target token), nll}; eval mode returns
    the decoded `ids` [B, L] (padded with pad_id after `<e>`), `ids_len`, `scores` (the hypothesis'
    summed log-probability; length-penalised under `length_penalty`) and, when the batch has targets,
    per-sentence `loss_sum`, `nll_sum` and `ntokens`.

    Decoding keys (module docstring): `beam_search_version` v1 with `max_out_len`, or length_penalty
    with `alpha`, `max_len_a`, `max_len_b`; None takes the search's default, and a key of the other
    search is refused (an override that did nothing would mislead).

    Args:
        src_vocab_size: the rows of the source embedding (the reader's padded vocabulary).
        trg_vocab_size: the rows of the target embedding and the outputs of the last projection;
            checked against the reader's `num_classes`.
        d_model: the width of every layer (512 base, 1024 big).
        d_inner_hid: the width of the feed-forward layers (2048 base, 4096 big).
        n_head: the attention heads per layer (8 base, 16 big).
        num_encoder_layers: the encoder layers.
        num_decoder_layers: the decoder layers.
        dropout: dropout on the embeddings and on each sublayer's output.
        attn_dropout: dropout on the attention weights (default: `dropout`).
        act_dropout: dropout after the feed-forward activation (default: `dropout`).
        normalize_before: pre-norm layers (LayerNorm before each sublayer, PaddleNLP's released
            models); false: the paper's post-norm.
        weight_sharing: tie the source and target embeddings and the output projection (one joint
            vocabulary: src_vocab_size = trg_vocab_size).
        max_length: the rows of the sinusoid position table (PaddleNLP's max_length + 1: 257 for its
            256), which bounds the source and output lengths.
        bos_id: the id decoding starts with (`<s>`).
        eos_id: the id that ends a sentence (`<e>`).
        pad_id: the padding id, masked in attention and the loss (0 = `<s>` in PaddleNLP's layout).
        label_smooth_eps: the label smoothing of the training loss, in [0, 1).
        beam_size: the hypotheses kept per sentence in the search (1: greedy with `length_penalty`).
        beam_search_version: `v1`: PaddleNLP's search (BeamSearchDecoder, no length penalty), what
            its published BLEU used; `length_penalty`: GNMT's length-penalised search.
        max_out_len: v1: the most tokens generated, plus one (default: max_length - 1).
        alpha: length_penalty: the exponent of the GNMT length penalty (default 0.6).
        max_len_a: length_penalty: a sentence stops at max_len_a * source length + max_len_b
            tokens (default 1.0).
        max_len_b: length_penalty: see max_len_a (default 50).
        use_cache: decode incrementally with cached self-attention keys and values; false recomputes
            the whole prefix every step (the same tokens; kept for tests and the benchmark).
        final_norm: the LayerNorm after each stack; false for PaddleNLP's post-norm files (which
            have none) and the paper's post-norm.
        recompute: activation checkpointing: recompute each layer's activations during backward
            instead of keeping them (the same gradients; the cost is in docs/performance.md, "Memory
            of a training step").
    """

    FINAL_NORMS = tuple(f"transformer.{stack}.norm.{p}" for stack in ("encoder", "decoder")
                        for p in ("weight", "bias"))

    def weights_hint(self, missing, unexpected):
        """A file that lacks only the stacks' final LayerNorms is laid out as PaddleNLP's post-norm
        TransformerModel (which builds none): say which setting reads it."""
        if not self.final_norm or unexpected or not missing or not set(missing) <= set(self.FINAL_NORMS):
            return None
        fact = "the file has no final LayerNorm after the encoder/decoder stacks (PaddleNLP's post-norm layout)"
        if self.normalize_before:   # PaddleNLP's pre-norm files have them: a post-norm file in a pre-norm recipe
            return (f"{fact}: if it was trained post-norm, set model.normalize_before: false and "
                    f"model.final_norm: false")
        return f"{fact}: set model.final_norm: false (-o model.final_norm=false)"

    def data_agreement(self):   # the target vocabulary is the classes of the reader (padded)
        return DataAgreement(num_classes=self.trg_vocab_size, num_classes_key="trg_vocab_size")

    def __init__(self, src_vocab_size: int = 33712, trg_vocab_size: int = 33712, d_model: int = 512,
                 d_inner_hid: int = 2048, n_head: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dropout: float = 0.1, attn_dropout: float = None,
                 act_dropout: float = None, normalize_before: bool = True, weight_sharing: bool = True,
                 max_length: int = 257, bos_id: int = 0, eos_id: int = 1, pad_id: int = 0,
                 label_smooth_eps: float = 0.1, beam_size: int = 5, beam_search_version: typing.Literal[SEARCHES] = "v1",
                 max_out_len: int = None, alpha: float = None, max_len_a: float = None, max_len_b: int = None,
                 use_cache: bool = True, final_norm: bool = True, recompute: bool = False):
        super().__init__()
        if weight_sharing and src_vocab_size != trg_vocab_size:
            raise ConfigError(f"Transformer: weight_sharing needs one joint vocabulary, but src_vocab_size "
                              f"{src_vocab_size} != trg_vocab_size {trg_vocab_size}")
        if not 0.0 <= label_smooth_eps < 1.0 or beam_size < 1 or max_length < 2:
            raise ConfigError(f"Transformer: need 0 <= label_smooth_eps < 1, beam_size >= 1, max_length >= 2; "
                              f"got {label_smooth_eps}, {beam_size}, {max_length}")
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
            if not 0 <= value < trg_vocab_size:
                raise ConfigError(f"Transformer: {name} {value} is outside the vocabulary of {trg_vocab_size}")
        self.trg_vocab_size = trg_vocab_size
        self.d_model, self.max_length = d_model, max_length
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.dropout, self.label_smooth_eps = dropout, label_smooth_eps
        self.beam_size = beam_size
        self.beam_search_version, self.max_out_len, self.alpha, self.max_len_a, self.max_len_b = \
            search_options(beam_search_version, max_out_len, alpha, max_len_a, max_len_b, max_length)
        self.use_cache = use_cache
        self.final_norm, self.normalize_before = final_norm, normalize_before
        self.src_word_embedding = WordEmbedding(src_vocab_size, d_model, pad_id)
        self.src_pos_embedding = PositionalEmbedding(d_model, max_length)
        if weight_sharing:
            self.trg_word_embedding = self.src_word_embedding
            self.trg_pos_embedding = self.src_pos_embedding
        else:
            self.trg_word_embedding = WordEmbedding(trg_vocab_size, d_model, pad_id)
            self.trg_pos_embedding = PositionalEmbedding(d_model, max_length)
        layer_args = dict(d_model=d_model, n_head=n_head, d_inner_hid=d_inner_hid, dropout=dropout,
                          attn_dropout=dropout if attn_dropout is None else attn_dropout,
                          act_dropout=dropout if act_dropout is None else act_dropout,
                          normalize_before=normalize_before)
        self.transformer = _Body(Encoder(num_encoder_layers, final_norm, recompute=recompute, **layer_args),
                                 Decoder(num_decoder_layers, final_norm, recompute=recompute, **layer_args))
        self.weight_sharing = weight_sharing
        if not weight_sharing:
            self.linear = nn.Linear(d_model, trg_vocab_size, bias_attr=False)

    # ------------------------------------------------------------------------------- pieces
    def _embed(self, words, pos, ids, mask):
        """Word + position embeddings; pad positions get position 0 (PaddleNLP: (word != pad) * arange)."""
        positions = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0) * mask.astype("int64")
        x = words(ids) + pos(positions)
        return F.dropout(x, self.dropout) if self.dropout and self.training else x

    def logits(self, h):
        if self.weight_sharing:
            return ops.matmul(h, self.trg_word_embedding.word_embedding.weight, transpose_y=True)
        return self.linear(h)

    def encode(self, src_ids, src_mask, index=None):
        """(memory [B, S, D], memory bias [B, 1, 1, S]); the source must fit the position table."""
        # an exported program sees sizes as tensors: its runner checks. No source is longer than the
        # padded width, so the lengths are read (a device-to-host copy on a GPU) only when it is too wide
        if paddle.in_dynamic_mode() and src_mask.shape[1] > self.max_length:
            check_source_lengths(src_mask.sum(axis=1).numpy(), self.max_length, index)
        bias = ((1.0 - src_mask.astype("float32")) * NEG).unsqueeze([1, 2])
        x = self._embed(self.src_word_embedding, self.src_pos_embedding, src_ids, src_mask)
        return self.transformer.encoder(x, bias), bias

    def decode_train(self, tgt_in, tgt_mask, memory, memory_bias):
        t = tgt_in.shape[1]
        causal = paddle.triu(paddle.full([t, t], NEG, dtype="float32"), diagonal=1)
        x = self._embed(self.trg_word_embedding, self.trg_pos_embedding, tgt_in, tgt_mask)
        h = self.transformer.decoder(x, self.transformer.decoder.memory_kv(memory), causal, memory_bias)
        return self.logits(h)

    def token_losses(self, logits, labels):
        """Per-token (label-smoothed loss, nll) [B, T] with q = (1 - eps) one_hot + eps / V
        (ops.smooth_cross_entropy: one fused pass over the logits, or its paddle reference)."""
        return ops.smooth_cross_entropy(logits.astype("float32"), labels, self.label_smooth_eps)

    # ------------------------------------------------------------------------------- forward
    def forward(self, batch):
        src, src_mask = batch["src_ids"], _mask(batch, "src_ids", self.pad_id)
        index = batch.get("index")   # only for a message naming the sample: read on the host then
        memory, memory_bias = self.encode(src, src_mask, index)
        out = {}
        if "tgt_out" in batch:
            tgt_in, labels = batch["tgt_in"], batch["tgt_out"]
            logits = self.decode_train(tgt_in, _mask(batch, "tgt_in", self.pad_id), memory, memory_bias)
            smoothed, nll = self.token_losses(logits, labels)
            weights = _mask(batch, "tgt_out", self.pad_id).astype("float32")
            ntokens = weights.sum(axis=1)
            if self.training:
                total = ntokens.sum()
                return {"loss": (smoothed * weights).sum() / total, "nll": (nll * weights).sum() / total}
            out.update(loss_sum=(smoothed * weights).sum(axis=1), nll_sum=(nll * weights).sum(axis=1),
                       ntokens=ntokens)
        elif self.training:
            raise ConfigError("Transformer: training needs 'tgt_in' and 'tgt_out' in the batch")
        hyps = self.search(memory, memory_bias, src_mask.sum(axis=1), self.beam_size, self.use_cache)
        out.update({k: paddle.to_tensor(v) for k, v in _pack([h[0] for h in hyps], self.pad_id).items()})
        return out

    # ------------------------------------------------------------------------------- export
    def decoder_step(self, ids, memory_kv, memory_bias, caches):
        """One cached decoder step, the network of every decoding step (dynamic and exported).

        `ids` [R, 1]: the last token of each row, at position t = the caches' length; `memory_kv`
        per decoder layer (keys, values) [R, H, S, dh]; `caches` per layer (keys, values) [R, H, t, dh]
        of the positions before. Returns (log-probabilities [R, V] of the next token, the caches
        extended by this position)."""
        pos = ids * 0 + paddle.shape(caches[0][0])[2]   # every row at t (zeros_like warns while tracing)
        x = self.trg_word_embedding(ids) + self.trg_pos_embedding(pos)
        state = [{"k": k, "v": v} for k, v in caches]
        h = self.transformer.decoder(x, memory_kv, None, memory_bias, state)
        return log_softmax(self.logits(h[:, -1])), [(c["k"], c["v"]) for c in state]

    def empty_caches(self, rows):
        """Per decoder layer (keys, values) of no position yet: [rows, H, 0, dh]."""
        h, dh = self._heads()
        return [(paddle.zeros([rows, h, 0, dh]), paddle.zeros([rows, h, 0, dh])) for _ in self.transformer.decoder.layers]

    def _heads(self):
        h = self.transformer.decoder.layers[0].self_attn.n_head
        return h, self.d_model // h

    def export_spec(self, example=None):
        """Two programs (the module docstring): `encoder` and `decoder_step`; the predictor as a whole
        takes the padded source and gives what the dynamic model's eval forward gives without targets."""
        h, dh = self._heads()
        layers = range(len(self.transformer.decoder.layers))
        kv = lambda prefix: {f"{prefix}_{w}{i}": InputSpec([None, h, None, dh], "float32")  # noqa: E731
                             for i in layers for w in "kv"}
        src = {"src_ids": InputSpec([None, None], "int64"), "src_ids_mask": InputSpec([None, None], "float32")}
        step_inputs = {"ids": InputSpec([None, 1], "int64"),
                       "memory_bias": InputSpec([None, 1, 1, None], "float32"), **kv("memory"), **kv("cache")}
        return {"inputs": src, "outputs": ["ids", "ids_len", "scores"],
                "programs": {"encoder": {"method": self.export_encoder, "inputs": src,
                                         "outputs": ["memory_bias"] + list(kv("memory"))},
                             "decoder_step": {"method": self.export_decoder_step, "inputs": step_inputs,
                                              "outputs": ["logp"] + list(kv("cache"))}},
                "settings": dict(self.search_settings(), layers=len(layers), heads=h, head_dim=dh),
                # the first step's cache holds no position yet
                "tensorrt": {"shapes": {"decoder_step": {f"cache_{w}{i}": {"min": [1, h, 0, dh]}
                                                         for i in layers for w in "kv"}}}}

    def export_encoder(self, batch):
        memory, bias = self.encode(batch["src_ids"], batch["src_ids_mask"])
        out = {"memory_bias": bias}
        for i, (k, v) in enumerate(self.transformer.decoder.memory_kv(memory)):
            out[f"memory_k{i}"], out[f"memory_v{i}"] = k, v
        return out

    def export_decoder_step(self, batch):
        layers = range(len(self.transformer.decoder.layers))
        logp, caches = self.decoder_step(
            batch["ids"], [(batch[f"memory_k{i}"], batch[f"memory_v{i}"]) for i in layers], batch["memory_bias"],
            [(batch[f"cache_k{i}"], batch[f"cache_v{i}"]) for i in layers])
        out = {"logp": logp}
        for i, (k, v) in enumerate(caches):
            out[f"cache_k{i}"], out[f"cache_v{i}"] = k, v
        return out

    @classmethod
    def exported_runner(cls, programs, settings):
        return ExportedTransformer(programs, settings)

    def search_settings(self):
        return dict(bos_id=self.bos_id, eos_id=self.eos_id, pad_id=self.pad_id, beam_size=self.beam_size,
                    beam_search_version=self.beam_search_version, max_out_len=self.max_out_len,
                    alpha=self.alpha, max_len_a=self.max_len_a, max_len_b=self.max_len_b,
                    max_length=self.max_length)

    # ------------------------------------------------------------------------------- decoding
    def translate(self, src_ids, src_mask=None, beam_size=None, use_cache=None, n_best=1):
        """Per sentence the `n_best` (tokens without <s>, score) best hypotheses, best first."""
        was_training = self.training
        self.eval()
        with paddle.no_grad():
            src_ids = paddle.to_tensor(src_ids)
            src_mask = (src_ids != self.pad_id).astype("float32") if src_mask is None else paddle.to_tensor(src_mask)
            memory, bias = self.encode(src_ids, src_mask)
            hyps = self.search(memory, bias, src_mask.sum(axis=1), beam_size or self.beam_size,
                               self.use_cache if use_cache is None else use_cache)
        self.train(was_training)
        return [h[:n_best] for h in hyps]

    def max_lengths(self, src_lengths):
        """Most tokens (`<e>` included) each sentence may generate: a * |source| + b, within the table."""
        return BeamSearch(**self.search_settings()).max_lengths(src_lengths)

    def search(self, memory, memory_bias, src_lengths, beam_size, use_cache=True):
        steps = self._stepper(memory, memory_bias, use_cache)
        return BeamSearch(**self.search_settings()).search(steps, memory.shape[0], src_lengths.numpy(), beam_size)

    def _stepper(self, memory, memory_bias, use_cache):
        if not use_cache:
            return _FullSteps(self, memory, memory_bias)
        run = lambda ids, memory_kv, bias, caches: self.decoder_step(  # noqa: E731
            paddle.to_tensor(ids), memory_kv, bias, caches)
        return _CachedSteps(run, self.transformer.decoder.memory_kv(memory), memory_bias,
                            self.empty_caches(memory.shape[0]), _take_rows)

    @paddle.no_grad()
    def greedy_search(self, memory, memory_bias, src_lengths, use_cache=True):
        """The length_penalty search at beam 1: the most probable next token until <e> or the
        sentence's maximum length."""
        steps = self._stepper(memory, memory_bias, use_cache)
        return BeamSearch(**self.search_settings()).greedy(steps, memory.shape[0], src_lengths.numpy())

    @paddle.no_grad()
    def beam_search(self, memory, memory_bias, src_lengths, beam_size, use_cache=True):
        """The length_penalty search: per sentence its finished hypotheses (tokens, score), best first."""
        steps = self._stepper(memory, memory_bias, use_cache)
        return BeamSearch(**self.search_settings()).beam(steps, memory.shape[0], src_lengths.numpy(), beam_size)


def check_source_lengths(lengths, max_length, index=None):
    """One line when a source (tokens with <e>, from its mask) is longer than the position table."""
    lengths = np.asarray(lengths)
    if not len(lengths) or lengths.max() <= max_length:
        return
    i = int(np.argmax(lengths))
    index = index.numpy() if isinstance(index, paddle.Tensor) else index
    which = f"sample {int(index[i])}" if index is not None else f"row {i}"
    raise ConfigError(f"Transformer: source of {which} has {int(lengths[i])} tokens (with <e>), more than the "
                      f"position table holds (model.max_length {max_length}); split the sentence or use a model "
                      f"with a larger max_length")


class BeamSearch:
    """The decoding loops over `steps`, an object with `step(last_tokens, t) -> log-probabilities [rows, V]`
    (a paddle tensor) and `select(rows)` (keep, reorder or repeat the rows of its state). The dynamic
    model's steps and the exported decoder program's steps run the same loops."""

    def __init__(self, bos_id=0, eos_id=1, pad_id=0, beam_size=5, beam_search_version="v1", max_out_len=256,
                 alpha=0.6, max_len_a=1.0, max_len_b=50, max_length=257):
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.beam_size, self.version, self.max_out_len, self.alpha = beam_size, beam_search_version, max_out_len, alpha
        self.max_len_a, self.max_len_b, self.max_length = max_len_a, max_len_b, max_length

    def max_lengths(self, src_lengths):
        n = np.floor(self.max_len_a * np.asarray(src_lengths, dtype=np.float64) + self.max_len_b).astype(np.int64)
        return np.clip(n, 1, self.max_length)

    def search(self, steps, n, src_lengths, beam_size=None):
        beam_size = beam_size or self.beam_size
        if self.version == "v1":
            return self.v1(steps, n, beam_size)
        if beam_size == 1:
            return self.greedy(steps, n, src_lengths)
        return self.beam(steps, n, src_lengths, beam_size)

    @paddle.no_grad()
    def greedy(self, steps, n, src_lengths):
        limits = self.max_lengths(src_lengths)
        tokens = [[] for _ in range(n)]
        logp_sum = np.zeros(n)
        alive = np.arange(n)
        last = np.full(n, self.bos_id, dtype=np.int64)
        for t in range(int(limits.max())):
            logp = steps.step(last, t)
            best = paddle.argmax(logp, axis=-1)
            best_logp = paddle.take_along_axis(logp, best.unsqueeze(-1), axis=-1).squeeze(-1)
            best, best_logp = best.numpy(), best_logp.numpy().astype(np.float64)
            keep = []
            for row, sent in enumerate(alive):
                tokens[sent].append(int(best[row]))
                logp_sum[sent] += best_logp[row]
                if best[row] != self.eos_id and t + 1 < limits[sent]:
                    keep.append(row)
            if not keep:
                break
            alive, last = alive[keep], best[keep]
            steps.select(np.asarray(keep, dtype=np.int64))
        return [[(tokens[i], logp_sum[i] / length_penalty(len(tokens[i]), self.alpha))] for i in range(n)]

    @paddle.no_grad()
    def beam(self, steps, n, src_lengths, beam_size):
        k = beam_size
        limits = self.max_lengths(src_lengths)
        steps.select(np.repeat(np.arange(n), k))
        finished = [[] for _ in range(n)]
        active = np.arange(n)                      # sentences still searching, in row-block order
        beam_logp = np.full((n, k), -np.inf)
        beam_logp[:, 0] = 0.0                      # one live hypothesis (<s>) to start from
        beam_tokens = [[[] for _ in range(k)] for _ in range(n)]
        last = np.full(n * k, self.bos_id, dtype=np.int64)
        for t in range(int(limits.max())):
            logp = steps.step(last, t)                                   # [m*k, V]
            vocab = logp.shape[-1]
            cand = logp + paddle.to_tensor(beam_logp.reshape([-1, 1]), dtype=logp.dtype)
            top_v, top_i = paddle.topk(cand.reshape([len(active), k * vocab]), 2 * k, axis=-1)
            top_v, top_i = top_v.numpy().astype(np.float64), top_i.numpy()
            next_rows, next_last, next_logp, next_tokens, next_active = [], [], [], [], []
            for j, sent in enumerate(active):
                alive_logp, alive_tokens, alive_rows = [], [], []
                for r in range(2 * k):
                    score = top_v[j, r]
                    if not np.isfinite(score):
                        continue
                    origin, token = divmod(int(top_i[j, r]), vocab)
                    seq = beam_tokens[j][origin] + [token]
                    if token == self.eos_id:
                        if r < k:
                            finished[sent].append((seq, score / length_penalty(len(seq), self.alpha)))
                    elif len(alive_logp) < k:
                        alive_logp.append(score)
                        alive_tokens.append(seq)
                        alive_rows.append(j * k + origin)
                if t + 1 >= limits[sent]:   # out of length: the live hypotheses end here, unfinished
                    finished[sent] += [(seq, lp / length_penalty(len(seq), self.alpha))
                                       for seq, lp in zip(alive_tokens, alive_logp)]
                if len(finished[sent]) >= k or t + 1 >= limits[sent] or not alive_logp:
                    continue
                while len(alive_logp) < k:   # fewer than k live candidates: pad with dead beams
                    alive_logp.append(-np.inf)
                    alive_tokens.append(alive_tokens[0])
                    alive_rows.append(alive_rows[0])
                next_active.append(sent)
                next_rows += alive_rows
                next_last += [seq[-1] for seq in alive_tokens]
                next_logp.append(alive_logp)
                next_tokens.append(alive_tokens)
            if not next_active:
                break
            steps.select(np.asarray(next_rows, dtype=np.int64))
            active, last = np.asarray(next_active), np.asarray(next_last, dtype=np.int64)
            beam_logp, beam_tokens = np.asarray(next_logp), next_tokens
        out = []
        for hyps in finished:
            hyps.sort(key=lambda h: -h[1])   # stable: among equal scores the earlier finished first
            out.append(hyps[:k])
        return out

    @paddle.no_grad()
    def v1(self, steps, n, beam_size):
        """paddle.nn.BeamSearchDecoder's search, as PaddleNLP's v1 runs it under dynamic_decode.

        Every sentence keeps `beam_size` slots, each scored by its summed log-probabilities (no length
        penalty). A step ranks all slots' continuations together and keeps the best `beam_size` in
        order; a finished slot (it made <e>) offers one continuation only, <e> again at no cost, so it
        survives only while no live continuation beats it. A sentence is done when all its slots are
        finished; dynamic_decode(max_step_num=max_out_len) stops after max_out_len + 1 steps at the
        latest. Returns per sentence its slots (tokens through the first <e>, score), best first: slot
        0 is what PaddleNLP's predict.py writes (n_best 1).

        The candidates are laid out as BeamSearchDecoder lays them out ([slot, token] of each sentence,
        one topk), so its ordering and ties carry over; only the live slots run the decoder (a finished
        slot's step is masked anyway), and sentences leave the batch when done (their slots can no longer
        change: a finished slot's score stays, live continuations only lose)."""
        k, eos = beam_size, self.eos_id
        tokens = [[[] for _ in range(k)] for _ in range(n)]
        scores = np.zeros((n, k), np.float32)
        finished = np.zeros((n, k), bool)
        active = np.arange(n)                          # sentences still searching
        live_row = np.zeros((n, k), np.int64)          # slot -> its row in the step's log-probabilities
        last = np.full(n, self.bos_id, dtype=np.int64)
        for t in range(self.max_out_len + 1):
            logp = steps.step(last, t)                 # [live slots, V], float32
            vocab = logp.shape[-1]
            if t == 0:   # one live hypothesis (<s>) per sentence; BeamSearchDecoder's others start at -1e9
                if vocab < k:   # those would then be chosen: a search no one wants
                    raise ConfigError(f"Transformer: beam_size {k} is larger than the vocabulary ({vocab})")
                cand = logp
                origin_of = np.zeros((len(active), k), np.int64)
            else:
                live = ~finished[active]
                alive_part = logp + paddle.to_tensor(scores[active][live][:, None])
                ended = np.full((int((~live).sum()), vocab), -np.inf, np.float32)
                ended[:, eos] = scores[active][~live]      # <e> again, at no cost
                stacked = paddle.concat([alive_part, paddle.to_tensor(ended)]) if len(ended) else alive_part
                order = np.where(live, live_row[active], 0)
                order[~live] = logp.shape[0] + np.arange(len(ended))
                cand = paddle.index_select(stacked, paddle.to_tensor(order.reshape(-1))).reshape([len(active), -1])
            top_v, top_i = paddle.topk(cand, k, axis=-1)
            top_v, top_i = top_v.numpy(), top_i.numpy()
            origin_of = top_i // vocab if t else origin_of
            token_of = top_i % vocab
            next_rows, next_last, next_active = [], [], []
            for j, sent in enumerate(active):
                old_tokens, old_finished = tokens[sent], finished[sent].copy()
                origins = origin_of[j]
                tokens[sent] = [old_tokens[o] if old_finished[o] else old_tokens[o] + [int(token)]
                                for o, token in zip(origins, token_of[j])]
                finished[sent] = old_finished[origins] | (token_of[j] == eos)
                scores[sent] = top_v[j]
                if finished[sent].all():
                    continue
                rows_before = live_row[sent].copy()
                for slot in range(k):
                    if not finished[sent, slot]:
                        live_row[sent, slot] = len(next_rows)
                        next_rows.append(int(rows_before[int(origin_of[j, slot])]) if t else j)
                        next_last.append(tokens[sent][slot][-1])
                next_active.append(sent)
            if not next_active or t == self.max_out_len:
                break
            steps.select(np.asarray(next_rows, dtype=np.int64))
            active, last = np.asarray(next_active), np.asarray(next_last, dtype=np.int64)
        return [[(tokens[i][s], float(scores[i, s])) for s in range(k)] for i in range(n)]


class _CachedSteps:
    """Decoder steps with the memory's keys/values projected once and a growing self-attention cache.

    `run(ids [R, 1] numpy, memory_kv, memory_bias, caches) -> (log-probabilities, caches)` computes a
    step: the model's `decoder_step`, or the exported program (`ExportedTransformer`); `take(x, rows)`
    gathers rows of its state (paddle tensors or numpy arrays)."""

    def __init__(self, run, memory_kv, memory_bias, caches, take):
        self.run, self.take = run, take
        self.memory_kv, self.memory_bias, self.caches = memory_kv, memory_bias, caches
        self.sentence = np.arange(memory_bias.shape[0])   # the source sentence of each row

    def select(self, rows):
        """Keep (and reorder, repeat) the given rows of every state tensor. The memory's keys/values are
        gathered only when the rows' sentences change (not when beams of one sentence swap places)."""
        take = self.take
        sentence = self.sentence[rows]
        if not np.array_equal(sentence, self.sentence):
            self.memory_kv = [(take(k, rows), take(v, rows)) for k, v in self.memory_kv]
            self.memory_bias = take(self.memory_bias, rows)
        self.sentence = sentence
        self.caches = [(take(k, rows), take(v, rows)) for k, v in self.caches]

    def step(self, last_tokens, t):
        """Log-probabilities [rows, V] of the token after `last_tokens` (which sit at position t, the
        caches' length)."""
        ids = np.asarray(last_tokens, dtype=np.int64).reshape([-1, 1])
        logp, self.caches = self.run(ids, self.memory_kv, self.memory_bias, self.caches)
        return logp


def _take_rows(x, rows):
    return paddle.index_select(x, paddle.to_tensor(rows))


class _FullSteps:
    """Decoder steps that recompute the decoder over the whole prefix (no cache), for comparison."""

    def __init__(self, model, memory, memory_bias):
        self.model, self.memory, self.memory_bias = model, memory, memory_bias
        self.prefix = None

    def select(self, rows):
        idx = paddle.to_tensor(rows)
        self.memory = paddle.index_select(self.memory, idx)
        self.memory_bias = paddle.index_select(self.memory_bias, idx)
        if self.prefix is not None:
            self.prefix = self.prefix[rows]

    def step(self, last_tokens, t):
        m = self.model
        last = np.asarray(last_tokens, dtype=np.int64).reshape([-1, 1])
        self.prefix = last if self.prefix is None else np.concatenate([self.prefix, last], axis=1)
        ids = paddle.to_tensor(self.prefix)
        pos = paddle.arange(t + 1, dtype="int64").unsqueeze(0).expand([ids.shape[0], t + 1])
        x = m.trg_word_embedding(ids) + m.trg_pos_embedding(pos)
        causal = paddle.triu(paddle.full([t + 1, t + 1], NEG, dtype="float32"), diagonal=1)
        decoder = m.transformer.decoder
        h = decoder(x, decoder.memory_kv(self.memory), causal, self.memory_bias)
        return log_softmax(m.logits(h[:, -1]))


def log_softmax(logits):
    """x - logsumexp(x) in float32: paddle 3.3's CPU log_softmax kernel is hundreds of times slower on
    a decoding step's [beam x sentences, vocabulary] logits (docs/performance.md#fused-operators)."""
    logits = logits.astype("float32")
    return logits - paddle.logsumexp(logits, axis=-1, keepdim=True)


def _mask(batch, key, pad_id):
    mask = batch.get(key + "_mask")
    if mask is None:
        return (batch[key] != pad_id).astype("float32")
    return mask


def _pack(hyps, pad_id):
    """[(tokens, score)] -> {ids [B, L] padded with pad_id, ids_len [B], scores [B]} (numpy)."""
    longest = max([len(t) for t, _ in hyps] + [1])
    ids = np.full((len(hyps), longest), pad_id, dtype=np.int64)
    for i, (tokens, _) in enumerate(hyps):
        ids[i, :len(tokens)] = tokens
    return {"ids": ids, "ids_len": np.array([len(t) for t, _ in hyps], dtype=np.int64),
            "scores": np.array([s for _, s in hyps], dtype=np.float32)}


class ExportedTransformer:
    """The exported `encoder` and `decoder_step` programs driven by `BeamSearch`, as the predictor's
    `run(feeds) -> {ids, ids_len, scores}` (numpy or tensor feeds; numpy out, the dynamic model's eval
    outputs). The programs run on tensors: the memory and the growing cache stay on the predictor's
    device between steps (rows gathered there); only each step's last tokens come from the host and
    the search reads the log-probabilities it picks from, as the dynamic model's search does."""

    def __init__(self, programs, settings):
        self.encoder, self.decoder_step = programs["encoder"], programs["decoder_step"]
        settings = dict(settings)
        settings.setdefault("beam_search_version", "length_penalty")   # exported before v1 existed
        self.layers, self.heads, self.head_dim = (settings.pop(k) for k in ("layers", "heads", "head_dim"))
        self.search = BeamSearch(**settings)

    def __call__(self, feeds):
        src, mask = (v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v)
                     for v in (feeds["src_ids"], feeds["src_ids_mask"]))
        lengths = mask.sum(axis=1).numpy()
        check_source_lengths(lengths, self.search.max_length, feeds.get("index"))
        enc = self.encoder({"src_ids": src, "src_ids_mask": mask})
        n = src.shape[0]
        memory_kv = [(enc[f"memory_k{i}"], enc[f"memory_v{i}"]) for i in range(self.layers)]
        empty = paddle.zeros([n, self.heads, 0, self.head_dim], "float32")
        steps = _CachedSteps(self._run, memory_kv, enc["memory_bias"], [(empty, empty)] * self.layers, _take_rows)
        hyps = self.search.search(steps, n, lengths)
        return _pack([h[0] for h in hyps], self.search.pad_id)

    def _run(self, ids, memory_kv, memory_bias, caches):
        feeds = {"ids": paddle.to_tensor(ids), "memory_bias": memory_bias}
        for i, ((mk, mv), (ck, cv)) in enumerate(zip(memory_kv, caches)):
            feeds.update({f"memory_k{i}": mk, f"memory_v{i}": mv, f"cache_k{i}": ck, f"cache_v{i}": cv})
        out = self.decoder_step(feeds)
        return out["logp"], [(out[f"cache_k{i}"], out[f"cache_v{i}"]) for i in range(self.layers)]


# ---------------------------------------------------------------- pretrained entries (PaddleNLP releases)
# the vocabulary of PaddleNLP's WMT14 en-de data, as paddlenlp/datasets/wmt14ende.py names it (a member of
# the dataset archive; the member's md5 from the same file)
_WMT14_ASSETS = {"vocab": {
    "urls": ["https://bj.bcebos.com/paddlenlp/datasets/WMT14.en-de.tar.gz",
             "https://paddlenlp.bj.bcebos.com/datasets/WMT14.en-de.tar.gz"],
    "archive_member": "WMT14.en-de/wmt14_ende_data_bpe/vocab_all.bpe.33708",
    "member_md5": "2fc775b7df37368e936a8e1f63846bb0"}}
_WMT14_VOCAB = ("the WMT14 en-de BPE vocabulary vocab_all.bpe.33708 (asset 'vocab': reader `vocab: "
                "transformer_base_wmt14ende:vocab`, a member of PaddleNLP's WMT14.en-de.tar.gz dataset archive)")
_NO_CODES = ("PaddleNLP's source names no BPE codes file for raw text: translate its BPE-split files "
             "(input_format: bpe), or give codes learnt as its gen_data.sh does (Moses tokenizer.perl -l LANG, "
             "subword-nmt learn_bpe -s 32000 on the tokenised en+de training text) with input_format: raw")
_WMT14_ARGS = {"src_vocab_size": 33712, "trg_vocab_size": 33712, "normalize_before": True, "weight_sharing": True,
               "bos_id": 0, "eos_id": 1, "pad_id": 0}

WEIGHTS.add(PretrainedEntry(
    name="transformer_base_wmt14ende",
    model="Transformer",
    urls=["https://bj.bcebos.com/paddlenlp/models/transformers/transformer/transformer-base-wmt_ende_bpe.tar.gz",
          "https://paddlenlp.bj.bcebos.com/models/transformers/transformer/transformer-base-wmt_ende_bpe.tar.gz"],
    archive_member="base_trained_models/step_final/transformer.pdparams",
    source="PaddleNLP dygraph .pdparams (TransformerModel: pre-norm, shared 33712-entry vocabulary)",
    model_args=dict(PRESETS["base"], max_length=257, **_WMT14_ARGS),
    metrics={"bleu_tok": 26.89},
    metrics_source="PaddleNLP examples/machine_translation/transformer/fast_transformer/README.md (base, "
                   "beam 5, v1 search as FastGeneration's beam_search, tokenised multi-bleu.perl on "
                   "newstest2014.tok.de)",
    dataset="WMT14 en-de newstest2014",
    num_params=61532672,
    config="configs/nlp/transformer/transformer_base_30e_wmt14ende.yaml",
    notes=f"Needs {_WMT14_VOCAB}. {_NO_CODES}. Keys are PaddleNLP's own names (no key map); the target "
          "embeddings are aliases of the source ones.",
    reproduced="a state dict built from the official parameter table loads with no missing or unexpected keys; "
               "the file was not downloaded here",
    assets=_WMT14_ASSETS,
))

WEIGHTS.add(PretrainedEntry(
    name="transformer_big_wmt14ende",
    model="Transformer",
    urls=[],
    source="PaddleNLP TransformerModel, big configuration",
    model_args=dict(PRESETS["big"], max_length=1025, **_WMT14_ARGS),
    metrics={"bleu_tok": 27.48},
    metrics_source="PaddleNLP examples/machine_translation/transformer/README.md (big; Feb 2021, when "
                   "predict.py ran dynamic_decode with beam 5, max_out_len 1024; tokenised multi-bleu.perl "
                   "on newstest2014.tok.de)",
    dataset="WMT14 en-de newstest2014",
    num_params=211932160,
    config="configs/nlp/transformer/transformer_big_30e_wmt14ende.yaml",
    notes="PaddleNLP's source names no download for its big model's weights (only the BLEU it reached); a "
          f"file trained with its recipe loads as the base one does. It needs {_WMT14_VOCAB}.",
    reproduced="not run (no released file)",
    assets=_WMT14_ASSETS,
))
