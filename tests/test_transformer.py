"""Transformer for translation: official parameter count and names, decoding (PaddleNLP's v1 search =
paddle.nn.BeamSearchDecoder; the length-penalty option: beam 1 = greedy, cache = no cache, scores with
the penalty), the Translation reader (both tokenisation paths, token
budgets, bad input in one line), BLEU, checkpoint averaging, and the demo recipe trained once."""
import json
import os

import numpy as np
import paddle
import pytest

from data import demo_translation
from data.demo_translation import word_for_word_bleu
from engine import builder, config
from engine.components import load_all
from engine.data import PadSequences
from engine.errors import ConfigError
from engine.training import checkpoint
from engine.training.evaluator import evaluate
from engine.training.samplers import TokenBudget
from engine.weights import pretrained
from engine.weights.pretrained import WEIGHTS, load_entry_state
from metrics.translation import BLEU
from models.nlp.transformer import Transformer, length_penalty, search_options
from readers.translation import Translation
from tests.helpers import ROOT, assert_one_line_error, gradients_with_and_without, peaked_transformer, read_metrics, tool

load_all()
DATA = os.path.join(ROOT, "tests", "data")
DEMO = "configs/nlp/transformer/transformer_demo.yaml"


# ------------------------------------------------------------------------------------ model size and names

def test_base_has_the_official_parameter_count_and_loads_the_official_table():
    # by hand: per encoder layer 4 attention projections (512x512 + 512), FFN 512x2048 + 2048 and
    # 2048x512 + 512, 2 LayerNorms; a decoder layer has 8 projections and 3 LayerNorms
    enc_layer = 4 * (512 * 512 + 512) + 512 * 2048 + 2048 + 2048 * 512 + 512 + 2 * 2 * 512
    dec_layer = 8 * (512 * 512 + 512) + 512 * 2048 + 2048 + 2048 * 512 + 512 + 3 * 2 * 512
    assert (enc_layer, dec_layer) == (3_152_384, 4_204_032)
    expected = 33712 * 512 + 257 * 512 + 6 * enc_layer + 6 * dec_layer + 2 * 1024
    assert expected == 61_532_672
    with open(os.path.join(DATA, "keys_paddlenlp_transformer_base_wmt14ende.json")) as f:
        table = json.load(f)
    assert table["num_params"] == expected
    entry = WEIGHTS.get("transformer_base_wmt14ende")
    model = Transformer(**entry.model_args)
    assert builder.count_params(model) == expected
    # the position table is a parameter (counted) whose output never carries a gradient
    assert not model.src_pos_embedding.pos_encoder.weight.stop_gradient
    # every tensor of the official table, each filled with its own value; aliases share their original's
    values = {key: float(i) for i, (key, *_rest) in enumerate(table["params"])}
    for alias, original in table["aliases"].items():
        values[alias] = values[original]
    state = {key: np.full(shape, values[key], dtype=dtype) for key, shape, dtype, _ in table["params"]}
    report = load_entry_state(model, state, entry, strict=True, log=lambda *_: None)
    assert report["missing"] == [] and report["unexpected"] == []
    own = model.state_dict()
    assert set(own) == set(state)
    for key in ("src_word_embedding.word_embedding.weight", "transformer.decoder.layers.5.cross_attn.v_proj.bias",
                "transformer.encoder.norm.weight", "trg_pos_embedding.pos_encoder.weight"):
        assert float(own[key].numpy().ravel()[0]) == values[key]


@pytest.mark.parametrize("normalize_before", [True, False])
def test_same_outputs_as_paddle_nn_transformer_wired_as_paddlenlp(normalize_before):
    """PaddleNLP's TransformerModel is paddle.nn.Transformer between its embeddings and the tied
    projection: with our weights copied into paddle's layers (same names under `transformer.`), paddle's
    forward, wired as PaddleNLP's (embeddings x sqrt(d), positions (word != pad) * arange, -1e9 on pad
    keys, paddle's causal mask), gives our logits."""
    paddle.seed(2)
    d, heads = 16, 4
    ours = Transformer(src_vocab_size=32, trg_vocab_size=32, d_model=d, d_inner_hid=24, n_head=heads,
                       num_encoder_layers=2, num_decoder_layers=2, max_length=20, dropout=0.0,
                       normalize_before=normalize_before)
    ours.eval()
    ref = paddle.nn.Transformer(d, heads, 2, 2, 24, dropout=0.0, normalize_before=normalize_before)
    ref.eval()
    state = {k[len("transformer."):]: v for k, v in ours.state_dict().items() if k.startswith("transformer.")}
    assert set(state) == set(ref.state_dict())
    ref.set_state_dict(state)
    src = paddle.to_tensor([[5, 9, 3, 1, 0, 0], [7, 8, 6, 4, 2, 1]])
    tgt = paddle.to_tensor([[0, 11, 12, 0], [0, 13, 14, 15]])
    tgt_mask = paddle.to_tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])

    def embed(words, pos, ids):
        positions = (ids != 0).astype("int64") * paddle.arange(ids.shape[1], dtype="int64")
        return words.word_embedding(ids) * d ** 0.5 + pos.pos_encoder(positions)

    bias = (src == 0).astype("float32").unsqueeze([1, 2]) * -1e9
    out = ref(embed(ours.src_word_embedding, ours.src_pos_embedding, src),
              embed(ours.trg_word_embedding, ours.trg_pos_embedding, tgt), src_mask=bias,
              tgt_mask=ref.generate_square_subsequent_mask(4), memory_mask=bias)
    expected = paddle.matmul(out, ours.trg_word_embedding.word_embedding.weight, transpose_y=True).numpy()
    memory, memory_bias = ours.encode(src, (src != 0).astype("float32"))
    got = ours.decode_train(tgt, tgt_mask, memory, memory_bias).numpy()
    # row 0's last target position is padding (its embedding input differs: PaddleNLP gives it position 0
    # and the zero <s>/pad embedding, as we do); compare every real position
    np.testing.assert_allclose(got[0, :3], expected[0, :3], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)


def test_presets_and_post_norm_layout():
    with paddle.LazyGuard():
        big = Transformer(d_model=1024, d_inner_hid=4096, n_head=16, max_length=1025)
        post = Transformer(normalize_before=False, weight_sharing=False)
        paper = Transformer(normalize_before=False, final_norm=False)
    keys = set(post.state_dict())
    assert "transformer.encoder.norm.weight" in keys and "linear.weight" in keys     # paddle's post-norm, untied
    assert "transformer.decoder.norm.weight" not in set(paper.state_dict())           # the paper's post-norm
    assert "trg_word_embedding.word_embedding.weight" in keys
    d, f = 1024, 4096
    enc_layer = 4 * (d * d + d) + d * f + f + f * d + d + 2 * 2 * d
    dec_layer = 8 * (d * d + d) + d * f + f + f * d + d + 3 * 2 * d
    assert (enc_layer, dec_layer) == (12_596_224, 16_796_672)
    assert builder.count_params(big) == 33712 * d + 1025 * d + 6 * enc_layer + 6 * dec_layer + 2 * 2 * d


def test_sinusoid_table_and_scaled_embeddings():
    paddle.seed(0)
    m = Transformer(src_vocab_size=16, trg_vocab_size=16, d_model=8, d_inner_hid=16, n_head=2, num_encoder_layers=1,
                    num_decoder_layers=1, max_length=10, dropout=0.0)
    table = m.src_pos_embedding.pos_encoder.weight.numpy()
    # tensor2tensor layout: channels 0..3 sin(p / 10000**(i/3)), channels 4..7 cos of the same
    p, i = 3, 1
    assert table[p, i] == pytest.approx(np.sin(p / 10000 ** (i / 3)), abs=1e-6)
    assert table[p, 4 + i] == pytest.approx(np.cos(p / 10000 ** (i / 3)), abs=1e-6)
    assert m.src_pos_embedding(paddle.to_tensor([[1, 2]])).stop_gradient   # never trained
    emb = m.src_word_embedding(paddle.to_tensor([[5, 0]])).numpy()
    assert np.allclose(emb[0, 0], m.src_word_embedding.word_embedding.weight.numpy()[5] * np.sqrt(8), atol=1e-6)
    assert not emb[0, 1].any()   # the pad id (<s>, 0) embeds to zeros, as PaddleNLP's padding_idx


def test_label_smoothed_loss_ignores_padding():
    m = Transformer(src_vocab_size=4, trg_vocab_size=4, d_model=8, d_inner_hid=8, n_head=2, num_encoder_layers=1,
                    num_decoder_layers=1, max_length=8, label_smooth_eps=0.1, dropout=0.0)
    logits = paddle.to_tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    smoothed, nll = m.token_losses(logits, paddle.to_tensor([[0, 3]]))
    z = np.log(np.exp(2.0) + 3)   # log-sum-exp of the first row
    # q = 0.9 one_hot + 0.1 / 4: -sum q log p = 0.9 (z - 2) + 0.025 (4 z - 2)
    assert smoothed.numpy()[0, 0] == pytest.approx(0.9 * (z - 2) + 0.025 * (4 * z - 2), rel=1e-5)
    assert nll.numpy()[0, 0] == pytest.approx(z - 2, rel=1e-5)
    assert smoothed.numpy()[0, 1] == pytest.approx(np.log(4), rel=1e-5)   # uniform row: log V either way
    batch = {"src_ids": paddle.to_tensor([[2, 1, 0]]), "src_ids_mask": paddle.to_tensor([[1.0, 1.0, 0.0]]),
             "tgt_in": paddle.to_tensor([[0, 3, 0]]), "tgt_in_mask": paddle.to_tensor([[1.0, 1.0, 0.0]]),
             "tgt_out": paddle.to_tensor([[3, 1, 0]]), "tgt_out_mask": paddle.to_tensor([[1.0, 1.0, 0.0]])}
    m.train()
    with_pad = m(batch)["loss"].item()
    batch["tgt_out"] = paddle.to_tensor([[3, 1, 2]])   # another label under the mask changes nothing
    assert m(batch)["loss"].item() == pytest.approx(with_pad, rel=1e-6)


@pytest.mark.parametrize("normalize_before", [True, False])
def test_recompute_gives_the_same_gradients_with_dropout_on(normalize_before):
    paddle.seed(2)
    m = Transformer(src_vocab_size=16, trg_vocab_size=16, d_model=16, d_inner_hid=32, n_head=2, num_encoder_layers=2,
                    num_decoder_layers=2, max_length=12, dropout=0.3, normalize_before=normalize_before)
    rng = np.random.default_rng(0)
    ids = lambda: paddle.to_tensor(rng.integers(2, 16, (3, 7)))   # noqa: E731
    batch = {"src_ids": ids(), "tgt_in": ids(), "tgt_out": ids()}

    def switch(model, on):
        model.transformer.encoder.recompute = model.transformer.decoder.recompute = on

    (loss_a, ga, calls_a), (loss_b, gb, calls_b) = gradients_with_and_without(m, switch, batch,
                                                                              m.transformer.decoder.layers[1])
    assert (calls_a, calls_b) == (1, 2)       # the decoder layer ran again in backward
    assert loss_a == loss_b and ga.keys() == gb.keys() and len(ga) >= len(list(m.parameters())) - 1
    for k in ga:
        np.testing.assert_allclose(ga[k], gb[k], rtol=1e-6, atol=1e-7, err_msg=k)
    switch(m, False)
    paddle.seed(8)   # and dropout is really on: another seed, another loss
    assert m(batch)["loss"].item() != loss_a


# ------------------------------------------------------------------------------------ decoding

@pytest.fixture(scope="module")
def small_model():
    """tests.helpers.peaked_transformer: peaked distributions, hypotheses ending at different lengths."""
    return peaked_transformer(alpha=0.6)


def _encoded(m, src):
    src = paddle.to_tensor(src)
    mask = (src != 0).astype("float32")
    memory, bias = m.encode(src, mask)
    return memory, bias, mask.sum(axis=1)


def test_beam_size_one_is_greedy(small_model):
    m, src = small_model
    memory, bias, lengths = _encoded(m, src)
    greedy = m.greedy_search(memory, bias, lengths)
    beam1 = m.beam_search(memory, bias, lengths, beam_size=1)
    for g, b in zip(greedy, beam1):
        assert g[0][0] == b[0][0]
        assert g[0][1] == pytest.approx(b[0][1], abs=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_decoder_equals_uncached(small_model, beam_size):
    m, src = small_model
    cached = m.translate(src, beam_size=beam_size, use_cache=True, n_best=beam_size)
    full = m.translate(src, beam_size=beam_size, use_cache=False, n_best=beam_size)
    for c, f in zip(cached, full):
        assert [t for t, _ in c] == [t for t, _ in f]
        np.testing.assert_allclose([s for _, s in c], [s for _, s in f], atol=1e-5)


def _sequence_logprob(m, src_row, tokens):
    """sum log p(token | prefix) by one teacher-forced pass (the reference for the search's scores)."""
    src = paddle.to_tensor(src_row[None])
    mask = (src != 0).astype("float32")
    memory, bias = m.encode(src, mask)
    tgt_in = paddle.to_tensor([[m.bos_id] + tokens[:-1]])
    logits = m.decode_train(tgt_in, paddle.ones(tgt_in.shape, "float32"), memory, bias)
    logp = paddle.nn.functional.log_softmax(logits, axis=-1).numpy()[0]
    return float(sum(logp[i, t] for i, t in enumerate(tokens)))


def test_beam_hypotheses_come_in_score_order_with_the_length_penalty(small_model):
    m, src = small_model
    hyps = m.translate(src, beam_size=4, n_best=4)
    lengths_seen = set()
    for row, per_sentence in zip(src, hyps):
        scores = [s for _, s in per_sentence]
        assert scores == sorted(scores, reverse=True)
        for tokens, score in per_sentence:
            lengths_seen.add(len(tokens))
            expected = _sequence_logprob(m, row, tokens) / ((5 + len(tokens)) / 6) ** 0.6
            assert score == pytest.approx(expected, abs=1e-4)
    assert len(lengths_seen) > 2    # the penalty mattered: hypotheses of several lengths
    assert length_penalty(1, 0.6) == pytest.approx(1.0) and length_penalty(7, 1.0) == pytest.approx(2.0)


def test_decoding_stops_at_the_maximum_length_and_the_position_table(small_model):
    m, src = small_model
    for per_sentence in m.translate(src, beam_size=3, n_best=3):
        assert all(len(t) <= 7 + 4 for t, _ in per_sentence)   # max_len_a * |source| + max_len_b
    long = np.full((1, 31), 5)
    long[0, -1] = 1
    with pytest.raises(ConfigError, match=r"row 0 has 31 tokens .*position table holds \(model.max_length 30\)"):
        m.translate(long)


# ------------------------------------------------------------------------------------ PaddleNLP's v1 search

def _beam_search_decoder(m, src, k):
    """The reference: paddle.nn.BeamSearchDecoder under paddle.nn.dynamic_decode(max_step_num=max_out_len),
    as PaddleNLP's InferTransformerModel (v1) runs them, with our network as the cell wired as its
    TransformerDecodeCell: word + position embedding of the last token (the position is the step,
    here the cache's length), the decoder layers over their self-attention caches, the tied output
    projection's logits. Returns (ids [B, T, k], summed log-probabilities [B, k])."""
    src = paddle.to_tensor(src)
    with paddle.no_grad():
        memory, bias = m.encode(src, (src != m.pad_id).astype("float32"))

        def cell(ids, caches, memory_kv, memory_bias):
            ids = ids.reshape([-1, 1])
            x = m.trg_word_embedding(ids) + m.trg_pos_embedding(ids * 0 + caches[0][0].shape[2])
            state = [{"k": ck, "v": cv} for ck, cv in caches]
            h = m.transformer.decoder(x, memory_kv, None, memory_bias, state)
            return m.logits(h[:, -1]), [(c["k"], c["v"]) for c in state]

        tile = lambda x: paddle.nn.BeamSearchDecoder.tile_beam_merge_with_batch(x, k)  # noqa: E731
        decoder = paddle.nn.BeamSearchDecoder(cell, m.bos_id, m.eos_id, k)
        ids, states = paddle.nn.dynamic_decode(
            decoder, inits=m.empty_caches(src.shape[0]), max_step_num=m.max_out_len, is_test=True,
            memory_kv=[(tile(mk), tile(mv)) for mk, mv in m.transformer.decoder.memory_kv(memory)],
            memory_bias=tile(bias))
    return ids.numpy(), states.log_probs.numpy()


@pytest.fixture(scope="module")
def v1_model():
    """peaked_transformer decoding with v1 (limit 12 + 1 tokens), its <e> embedding doubled: hypotheses
    end at many different steps, some sentences end all their beams early, some none."""
    m, src = peaked_transformer(beam_search_version="v1", max_out_len=12)
    emb = m.trg_word_embedding.word_embedding.weight
    w = emb.numpy()
    w[m.eos_id] *= 2
    emb.set_value(w)
    return m, src


def test_v1_search_equals_paddle_beam_search_decoder(v1_model, op_path_fp32):
    """Every beam's tokens and score, per sentence, against Paddle's own search on the same network.
    It fails on a length penalty in the ranking, on finished beams that leave the beam or continue
    with other tokens, and on one step fewer than dynamic_decode makes (each tried)."""
    m, src = v1_model
    k, eos = 4, m.eos_id
    ref_ids, ref_logp = _beam_search_decoder(m, src, k)
    ours = m.translate(src, beam_size=k, n_best=k)
    op_path_fp32.check("zoo_matmul")
    uncached = m.translate(src, beam_size=k, n_best=k, use_cache=False)
    out = m({"src_ids": paddle.to_tensor(src)})
    ends = []
    for i, per_sentence in enumerate(ours):
        assert len(per_sentence) == k
        for b, (tokens, score) in enumerate(per_sentence):
            ref = ref_ids[i, :, b].tolist()
            ref = ref[:ref.index(eos) + 1] if eos in ref else ref   # after <e> its beam repeats <e>
            assert tokens == ref, (i, b)
            assert score == pytest.approx(float(ref_logp[i, b]), abs=1e-5)
            ends.append((i, len(tokens), tokens[-1] == eos))
    # the batch exercises the search: lengths differ across sentences and beams, some sentences end
    # every beam before others, some hypotheses stop at the limit (max_out_len + 1 tokens, no <e>)
    assert len({n for _, n, _ in ends}) >= 4
    assert len({max(n for j, n, _ in ends if j == i) for i in range(len(src))}) >= 3
    assert any(not ended and n == m.max_out_len + 1 for _, n, ended in ends) and sum(e for *_, e in ends) >= 10
    assert [[t for t, _ in h] for h in uncached] == [[t for t, _ in h] for h in ours]
    # the eval forward gives slot 0 (PaddleNLP's predict.py writes beam 0, n_best 1), through its <e>
    for i, per_sentence in enumerate(ours):
        n = int(out["ids_len"][i])
        assert out["ids"][i, :n].numpy().tolist() == per_sentence[0][0]
        assert float(out["scores"][i]) == pytest.approx(per_sentence[0][1])


def test_search_keys_are_checked_against_the_version():
    small = dict(src_vocab_size=24, trg_vocab_size=24, d_model=8, d_inner_hid=8, n_head=2, num_encoder_layers=1,
                 num_decoder_layers=1, max_length=30)
    m = Transformer(**small)   # PaddleNLP's default search over the whole position table
    assert (m.beam_search_version, m.max_out_len, m.alpha) == ("v1", 29, None)
    m = Transformer(**small, beam_search_version="length_penalty")
    assert (m.max_out_len, m.alpha, m.max_len_a, m.max_len_b) == (None, 0.6, 1.0, 50)
    for bad, message in ((dict(beam_search_version="v2"), r"model.beam_search_version 'v2' is not one of v1, "
                                                          r"length_penalty"),
                         (dict(alpha=0.6), r"model.alpha applies to beam_search_version: length_penalty only"),
                         (dict(max_out_len=30), r"model.max_out_len 30 must be in \[0, model.max_length - 1 = 29\]"),
                         (dict(beam_search_version="length_penalty", max_out_len=20),
                          r"model.max_out_len applies to beam_search_version: v1 only")):
        with pytest.raises(ConfigError, match=message):
            Transformer(**small, **bad)
    # the WMT recipes decode as PaddleNLP's published runs: v1, beam 5, max_out_len 256 / 1024; one
    # override restores the length-penalty search with its former settings
    for name, limit in (("base", 256), ("big", 1024)):
        path = os.path.join(ROOT, f"configs/nlp/transformer/transformer_{name}_30e_wmt14ende.yaml")
        model = config.load(path)["model"]
        assert (model["beam_search_version"], model["beam_size"]) == ("v1", 5)
        assert search_options("v1", model.get("max_out_len"), None, None, None, model["max_length"])[1] == limit
        model = config.load(path, ["model.beam_search_version=length_penalty"])["model"]
        assert search_options("length_penalty", None, None, None, None, model["max_length"])[2:] == (0.6, 1.0, 50)
        assert not {"alpha", "max_len_a", "max_len_b", "max_out_len"} & set(model)


# ------------------------------------------------------------------------------------ reader

def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def demo_corpus():
    return demo_translation.make(os.path.join(ROOT, "data", "translation_demo"))


def test_sentencepiece_reader_samples_and_round_trip(demo_corpus, tmp_path):
    src = _write(tmp_path / "a.en", ["the dog sees a cat.", "", "the small boat helps some birds."])
    tgt = _write(tmp_path / "a.xx", ["lo pora ko pelipuret.", "lone line", "un pora ko vidat."])
    ds = Translation(src_file=src, tgt_file=tgt, spm_model=os.path.join(demo_corpus, "spm.model"), tgt_lang="en")
    assert len(ds) == 2 and ds.data_faults()["records_lost"] == 1          # the pair with an empty side
    assert "a.en:2" in ds.data_faults()["summary"] and ds.describe(1).endswith("a.en:3")
    assert ds.num_classes == 320 and (ds.bos_id, ds.eos_id, ds.pad_id) == (0, 1, 0)
    s = ds[0]
    assert s["src_ids"][-1] == 1 and s["tgt_in"][0] == 0 and s["tgt_out"][-1] == 1
    np.testing.assert_array_equal(s["tgt_in"][1:], s["tgt_out"][:-1])
    assert ds.lengths().tolist()[0] == [len(s["src_ids"]), len(s["tgt_in"])]
    assert ds.decode(list(s["src_ids"]) + [7, 7])[0] == "the dog sees a cat."   # stops at <e>


def test_files_of_different_lengths_and_vocabularies_that_do_not_fit(demo_corpus, tmp_path):
    spm_model = os.path.join(demo_corpus, "spm.model")
    src = _write(tmp_path / "a.en", ["one.", "two.", "three."])
    tgt = _write(tmp_path / "a.xx", ["eins.", "zwei."])
    with pytest.raises(ConfigError, match=r"a.en has 3 lines but .*a.xx has 2"):
        Translation(src_file=src, tgt_file=tgt, spm_model=spm_model)
    # a sentencepiece model trained with sentencepiece's default special ids (<unk> 0, <s> 1, </s> 2)
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(input=os.path.join(demo_corpus, "train.en"), model_prefix=str(tmp_path / "default"),
                                   vocab_size=64, model_type="bpe", logstream=open(os.devnull, "w"))
    with pytest.raises(ConfigError, match=r"its eos piece is '</s>' \(id 2\), the reader expects '<e>'; train it with data/spm_train.py"):
        Translation(src_file=src, spm_model=str(tmp_path / "default.model"))
    # the reader's vocabulary and the model's disagree: the engine's check names the model key
    cfg = config.load(os.path.join(ROOT, DEMO), ["model.src_vocab_size=33712", "model.trg_vocab_size=33712"])
    with pytest.raises(ConfigError, match=r"model.trg_vocab_size is 33712 but reader.train \(Translation\) has 320"):
        builder.check_agreement(builder.build_model(cfg["model"]), Translation(src_file=src, spm_model=spm_model))


@pytest.fixture(scope="module")
def moses_bpe(tmp_path_factory):
    """A small PaddleNLP-style pipeline: Moses-tokenised English, BPE codes learnt on it with
    subword-nmt, the vocabulary of the BPE-split text after <s>, <e>, <unk>."""
    import sacremoses
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe
    folder = tmp_path_factory.mktemp("moses_bpe")
    words = ["house", "houses", "garden", "gardens", "river", "rivers", "the", "a", "green", "small", "old", "it's"]
    rng = np.random.default_rng(0)
    raw = [" ".join(rng.choice(words, size=6)) + "." for _ in range(300)]
    tok = [sacremoses.MosesTokenizer("en").tokenize(line, return_str=True, escape=True) for line in raw]
    with open(folder / "codes", "w") as out:
        learn_bpe(tok, out, 20, min_frequency=2)
    with open(folder / "codes") as f:
        bpe = BPE(f)
    subwords = sorted({t for line in tok for t in bpe.process_line(line).split()})
    _write(folder / "vocab", ["<s>", "<e>", "<unk>"] + subwords)
    _write(folder / "train.en", raw)
    other = [" ".join(rng.choice(["zebra", "quokka", "yak", "wombat"], size=5)) + "." for _ in range(300)]
    tok_other = [sacremoses.MosesTokenizer("en").tokenize(line, return_str=True) for line in other]
    with open(folder / "codes_other", "w") as out:
        learn_bpe(tok_other, out, 30, min_frequency=2)
    return folder


def test_moses_bpe_path_round_trip_and_codes_that_do_not_fit(moses_bpe, tmp_path):
    f = moses_bpe
    src = _write(tmp_path / "in.en", ["it's the green house.", "the old gardens."])
    ds = Translation(src_file=src, tgt_file=src, vocab=str(f / "vocab"), bpe_codes=str(f / "codes"),
                     src_lang="en", tgt_lang="en", input_format="raw")
    assert ds.num_classes % 8 == 0 and ds.num_classes >= ds.vocab_size
    ids = ds[0]["tgt_out"]
    detok, tok = ds.decode(ids)
    assert detok == "it's the green house."          # Moses detokenised
    assert tok == "it &apos;s the green house ."       # tokenised as tokenizer.perl (escaped), BPE undone
    assert ds.references()[1] == ("the old gardens.", None)
    bpe_line = " ".join(ds.tgt_tok.tokens[i] for i in ids[:-1])
    bpe_file = _write(tmp_path / "in.bpe", [bpe_line])        # PaddleNLP's prepared (BPE-split) format
    pre = Translation(src_file=bpe_file, tgt_file=bpe_file, vocab=str(f / "vocab"), input_format="bpe", tgt_lang="en")
    np.testing.assert_array_equal(pre[0]["src_ids"], ds[0]["src_ids"])
    assert pre.references()[0] == ("it's the green house.", "it &apos;s the green house .")
    with pytest.raises(ConfigError, match=r"% of the tokens of the first 1 lines .* are unknown .*bpe_codes .*codes_other"):
        Translation(src_file=_write(tmp_path / "one.en", ["the old gardens."]), vocab=str(f / "vocab"),
                    bpe_codes=str(f / "codes_other"), input_format="raw")
    with pytest.raises(ConfigError, match=r"'<e>' has id 2, the recipe expects eos_id 1"):
        bad = _write(tmp_path / "bad_vocab", ["<s>", "<unk>", "<e>", "the"])
        Translation(src_file=src, vocab=bad, bpe_codes=str(f / "codes"))


def test_token_budget_batches_hold_the_budget_and_cover_every_sentence(demo_corpus):
    ds = Translation(src_file=os.path.join(demo_corpus, "valid.en"), tgt_file=os.path.join(demo_corpus, "valid.xx"),
                     spm_model=os.path.join(demo_corpus, "spm.model"))
    collate = PadSequences(keys={"src_ids": 0, "tgt_in": 0, "tgt_out": 0}, multiple=4)

    def sampler(world, rank, epoch):
        s = TokenBudget(max_tokens=300, bucket_width=4).bind(ds, shuffle=True, seed=5, num_replicas=world, rank=rank)
        s.set_epoch(epoch)
        return s

    for epoch in (0, 1):
        order = list(sampler(1, 0, epoch))          # the epoch's batches, as one card sees them
        assert sorted(i for b in order for i in b) == list(range(len(ds)))   # each sentence once
        for world in (1, 2, 3):
            per_rank = [list(sampler(world, rank, epoch)) for rank in range(world)]
            assert len({len(b) for b in per_rank}) == 1                   # every rank the same number of batches
            seen = []
            for batches in per_rank:
                for idx in batches:
                    batch = collate([ds[i] for i in idx])
                    width = max(batch["src_ids"].shape[1], batch["tgt_in"].shape[1])
                    assert len(idx) * width <= 300                       # the budget, padding included
                    seen += idx
            # every sentence once; besides, only the first batches again, repeated to even out the ranks
            padding = order[:len(per_rank[0]) * world - len(order)]
            expected = np.ones(len(ds), dtype=int)
            for idx in padding:
                expected[idx] += 1
            np.testing.assert_array_equal(np.bincount(seen, minlength=len(ds)), expected)


# ------------------------------------------------------------------------------------ metric and tools

class _Refs:
    """A stand-in evaluation dataset: decode = ids as words, references given."""

    def __init__(self, refs):
        self.refs = refs

    def decode(self, ids):
        return " ".join(f"w{int(i)}" for i in ids), None

    def references(self):
        return self.refs

    def moses_tokenize(self, text):
        return text


def test_bleu_perplexity_by_hand():
    m = BLEU()
    m.set_dataset(_Refs([("w1 w2 w3 w4 w5", None), ("w7 w8 w9 w7", None)]))
    m.update({"ids": np.array([[1, 2, 3, 4], [7, 8, 9, 7]]), "ids_len": np.array([4, 4]),
              "loss_sum": np.array([2.0, 4.0]), "nll_sum": np.array([1.5, 3.0]), "ntokens": np.array([5.0, 5.0])},
             {"index": np.array([0, 1])})
    out = m.accumulate()
    # every n-gram of the 8 hypothesis words matches: precisions 1; brevity penalty exp(1 - 9/8)
    assert out["bleu"] == pytest.approx(100 * np.exp(1 - 9 / 8), abs=1e-6)
    assert out["bleu_tok"] == pytest.approx(out["bleu"])
    assert out["loss"] == pytest.approx(0.6) and out["ppl"] == pytest.approx(np.exp(0.45))
    assert out["num_samples"] == 2


def _average_tool():
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import average_checkpoints
    return average_checkpoints


def test_average_checkpoints(tmp_path):
    model = paddle.nn.Linear(2, 2)
    for step, value in ((10, 1.0), (20, 2.0), (30, 6.0)):
        model.weight.set_value(np.full((2, 2), value, "float32"))
        checkpoint.save(str(tmp_path / "run" / "checkpoints" / f"step_{step}"), model, state={"step": step})
    out = tmp_path / "avg.pdparams"
    tool("average_checkpoints", tmp_path / "run", "--last", 2, "--output", out)
    avg = paddle.load(str(out))
    np.testing.assert_allclose(avg["weight"].numpy(), 4.0)       # (2 + 6) / 2, the newest two
    with pytest.raises(ConfigError, match=r"holds 3 complete checkpoints, fewer than --last 4; train with "
                                          r"train.keep_last >= 4"):
        _average_tool().checkpoints_to_average([str(tmp_path / "run")], 4)


# ------------------------------------------------------------------------------------ the demo recipe

def test_demo_reaches_bleu_50_and_beats_word_for_word(transformer_demo_run, demo_corpus):
    metrics = read_metrics(transformer_demo_run)
    baseline, _ = word_for_word_bleu(demo_corpus, "valid")
    print(f"\ndemo BLEU {metrics['bleu']:.2f} (bleu_tok {metrics['bleu_tok']:.2f}, ppl {metrics['ppl']:.3f}); "
          f"monotone word-for-word baseline {baseline:.2f}")
    assert metrics["bleu"] >= 50 and metrics["num_samples"] == 400
    assert baseline <= 0.6 * metrics["bleu"]
    assert {"bleu", "bleu_tok", "loss", "ppl"} <= set(metrics) and 1.0 <= metrics["ppl"] < 2.0
    log = open(os.path.join(str(transformer_demo_run), "train.log")).read()
    assert "sacrebleu nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in log   # the signature


def test_demo_model_decodes_alike_with_and_without_cache(transformer_demo_run, demo_corpus):
    cfg = config.load(os.path.join(ROOT, DEMO))
    model = builder.build_model(cfg["model"])
    model.set_state_dict(paddle.load(os.path.join(str(transformer_demo_run), "final", "model.pdparams")))
    ds = builder.build_dataset(cfg, "val")
    collate = PadSequences(keys={"src_ids": 0})
    batch = collate([{"src_ids": ds.load(i)["src_ids"]} for i in range(24)])
    for k in (1, 4):
        cached = model.translate(batch["src_ids"], beam_size=k, use_cache=True, n_best=k)
        full = model.translate(batch["src_ids"], beam_size=k, use_cache=False, n_best=k)
        assert [[t for t, _ in h] for h in cached] == [[t for t, _ in h] for h in full]
        np.testing.assert_allclose([s for h in cached for _, s in h], [s for h in full for _, s in h], atol=1e-5)
    greedy = model.translate(batch["src_ids"], beam_size=1)
    assert [h[0][0] for h in greedy] == [h[0][0] for h in model.translate(batch["src_ids"], beam_size=1, use_cache=False)]


def test_infer_translates_a_file_and_stdin_and_rejects_a_source_too_long(transformer_demo_run, tmp_path):
    import subprocess
    import sys
    from tests.helpers import ENV
    weights = os.path.join(str(transformer_demo_run), "final", "model.pdparams")
    inputs = _write(tmp_path / "in.en", ["the dog sees a cat.", "", "some old kings follow the tall farmer."])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "infer.py"), "-c", DEMO, "--weights", weights,
                           "--input", inputs, "-", "--output", str(out)], input="the dog sees a cat.\n",
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = (out / "translations.txt").read_text().split("\n")
    # the file's three lines (the empty one stays empty), then stdin's line, in input order; the verb
    # at the end agrees with the subject: singular -et, plural -ont
    assert len(lines) == 5 and lines[1] == "" and lines[3] == lines[0]
    assert lines[0].endswith("et.") and lines[2].endswith("ont.")
    long = _write(tmp_path / "long.en", ["the dog sees a cat " * 20 + "."])
    proc = tool("infer", "-c", DEMO, "--weights", weights, "--input", long, "--output", tmp_path / "out3", check=False)
    assert_one_line_error(proc, "sample 0 has", "more than the position table holds (model.max_length 64)")


def test_averaged_demo_checkpoints_evaluate(transformer_demo_run):
    tool_ = _average_tool()
    averaged = tool_.average(tool_.checkpoints_to_average([str(transformer_demo_run)], 2))
    cfg = config.load(os.path.join(ROOT, DEMO))
    model = builder.build_model(cfg["model"])
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in averaged.items()})
    loader, dataset, _ = builder.build_loader(cfg, "val")
    metrics = evaluate(model, loader, builder.build_metric(cfg, dataset))
    assert metrics["bleu"] >= 50 and metrics["num_samples"] == 400


def test_entries_carry_their_vocabulary_as_an_asset(tmp_path, monkeypatch):
    """`vocab: ENTRY:vocab` takes the file out of the download the entry names (here placed by hand in
    the cache, as an offline user would), checks the member's md5, and reads it."""
    import dataclasses
    import hashlib
    import tarfile
    base = WEIGHTS.get("transformer_base_wmt14ende")
    assert base.assets["vocab"]["archive_member"] == "WMT14.en-de/wmt14_ende_data_bpe/vocab_all.bpe.33708"
    member = tmp_path / "v" / "vocab.txt"
    member.parent.mkdir()
    _write(member, ["<s>", "<e>", "<unk>", "the", "dog"])
    archive = tmp_path / "cache" / "assets-toy" / "toy.tar.gz"
    archive.parent.mkdir(parents=True)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(member, arcname="toy/vocab.txt")
    md5 = hashlib.md5(member.read_bytes()).hexdigest()
    entry = dataclasses.replace(base, name="toy_entry", assets={"vocab": {
        "urls": ["https://example.invalid/toy.tar.gz"], "archive_member": "toy/vocab.txt", "member_md5": md5}})
    monkeypatch.setitem(WEIGHTS._items, "toy_entry", entry)
    monkeypatch.setenv("PADDLE_ZOO_HOME", str(tmp_path))
    monkeypatch.setattr(pretrained, "cache_dir", lambda: str(tmp_path / "cache"))
    path = pretrained.resolve_asset("toy_entry:vocab", progress=False)
    assert path.endswith(os.path.join("assets-toy", "toy", "toy", "vocab.txt"))
    ds = Translation(src_file=_write(tmp_path / "a.en", ["the dog"]), vocab="toy_entry:vocab", input_format="bpe")
    assert ds[0]["src_ids"].tolist() == [3, 4, 1]
    entry.assets["vocab"]["member_md5"] = "0" * 32
    with pytest.raises(ConfigError, match="expects 0000"):
        pretrained.resolve_asset("toy_entry:vocab", progress=False)
    with pytest.raises(ConfigError, match="carries no asset 'codes'"):
        pretrained.resolve_asset("toy_entry:codes")
