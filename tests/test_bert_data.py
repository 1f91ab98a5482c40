"""BERT data: pretraining pairs and masks (rates, specials, labels, determinism), HDF5, GLUE TSVs,
GLUE metrics by hand, the submission writer, one-line errors for bad input."""
import os

import numpy as np
import pytest

from engine.components import load_all
from engine.errors import ConfigError
from tests.helpers import ROOT

load_all()
from metrics import glue as M  # noqa: E402
from outputs import glue as O  # noqa: E402
from readers import bert_pretrain as P  # noqa: E402
from readers.glue import GLUE, TASKS  # noqa: E402

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "big", "small", "red", "un", "##believ",
         "##able", "."]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SPECIALS + WORDS) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents of 2-6 sentences of 3-9 words ('unbelievable' is three word pieces)."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    docs = []
    for _ in range(40):
        sents = [" ".join(rng.choice(WORDS[:12] + ["unbelievable"], int(rng.integers(3, 10)))) + " ."
                 for _ in range(int(rng.integers(2, 7)))]
        docs.append("\n".join(sents))
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def reader(corpus, vocab, **kw):
    kw.setdefault("max_seq_length", 32)
    kw.setdefault("max_predictions_per_seq", 5)
    return P.BertPretrainText(files=[corpus], vocab_file=vocab, **kw)


def test_masking_rates_specials_and_labels(corpus, vocab):
    ds = reader(corpus, vocab)
    tok = ds.tokenizer
    n_masked, n_tokens, kinds = 0, 0, {"mask": 0, "kept": 0, "random": 0}
    random_next, count = 0, 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            s = ds[i]
            ids, types, pos, lab = s["input_ids"], s["token_type_ids"], s["masked_lm_positions"], s["masked_lm_ids"]
            L = len(ids)
            assert L <= 32 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
            seps = np.flatnonzero(ids == tok.sep_id)
            assert len(seps) == 2 and (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
            # positions: sorted, inside the sequence, never [CLS]/[SEP]; as many as BERT's rule says
            assert list(pos) == sorted(set(pos.tolist())) and len(pos) == min(5, max(1, int(round(L * 0.15))))
            assert not set(pos.tolist()) & {0, *seps.tolist()}
            assert tok.cls_id not in lab and tok.sep_id not in lab
            for p_, orig in zip(pos, lab):
                if ids[p_] == tok.mask_id:
                    kinds["mask"] += 1
                elif ids[p_] == orig:
                    kinds["kept"] += 1
                else:
                    kinds["random"] += 1
                    assert not tok.inv_vocab[int(ids[p_])].startswith("[")   # replacements are ordinary words
            # every unmasked position holds an ordinary token (no stray [MASK])
            others = np.setdiff1d(np.arange(L), pos)
            assert tok.mask_id not in ids[others]
            n_masked += len(pos)
            n_tokens += L
            random_next += int(s["next_sentence_label"])
            count += 1
    total = sum(kinds.values())
    # 80/10/10 within 3 standard deviations (n ~ 1000); random draws can hit the original word (1/16)
    assert abs(kinds["mask"] / total - 0.8) < 3 * np.sqrt(0.16 / total)
    assert abs(kinds["kept"] / total - 0.1 - 0.1 / 16) < 3 * np.sqrt(0.09 / total) + 0.01
    assert abs(kinds["random"] / total - 0.1 + 0.1 / 16) < 3 * np.sqrt(0.09 / total) + 0.01
    assert 0.11 < n_masked / n_tokens < 0.19
    # NSP: 50% random plus the one-sentence chunks that must take a random B
    assert 0.45 < random_next / count < 0.75


def test_samples_depend_on_seed_epoch_index_only(corpus, vocab):
    a, b = reader(corpus, vocab), reader(corpus, vocab)
    b.set_epoch(0)
    for i in (0, 7, 30):
        sa, sb = a[i], b[i]
        for k in P.SAMPLE_KEYS:
            np.testing.assert_array_equal(sa[k], sb[k])
    a.set_epoch(1)
    assert any(not np.array_equal(a[i]["masked_lm_positions"], b[i]["masked_lm_positions"]) for i in range(10))
    c = reader(corpus, vocab, seed=3)
    assert any(not np.array_equal(c[i]["input_ids"], b[i]["input_ids"]) for i in range(10))


def test_short_sequences_and_full_ones(corpus, vocab):
    long_ = reader(corpus, vocab, short_seq_prob=0.0, max_seq_length=24)
    lengths = [len(long_[i]["input_ids"]) for i in range(len(long_))]
    assert max(lengths) == 24 and np.mean(np.array(lengths) == 24) > 0.5   # chunks fill the target
    short = reader(corpus, vocab, short_seq_prob=1.0, max_seq_length=24)
    assert np.mean([len(short[i]["input_ids"]) for i in range(len(short))]) < np.mean(lengths)


def test_whole_word_masking_takes_all_pieces(corpus, vocab):
    ds = reader(corpus, vocab, whole_word_mask=True, max_predictions_per_seq=8)
    tok = ds.tokenizer
    cont = {tok.vocab["##believ"], tok.vocab["##able"]}
    seen = 0
    for i in range(len(ds)):
        s = ds[i]
        pos, lab = set(s["masked_lm_positions"].tolist()), dict(zip(s["masked_lm_positions"].tolist(), s["masked_lm_ids"].tolist()))
        orig = s["input_ids"].copy()
        for p_, t in lab.items():
            orig[p_] = t
        for j in range(1, len(orig)):
            # a continuation piece is masked exactly when the piece before it is (unless a front
            # truncation cut the word, leaving the piece right after [CLS] / [SEP])
            if orig[j] in cont and orig[j - 1] not in (tok.cls_id, tok.sep_id):
                assert (j in pos) == (j - 1 in pos), (j, sorted(pos), tok.convert_ids_to_tokens(orig))
                seen += j in pos
    assert seen > 0


def test_hdf5_round_trip(corpus, vocab, tmp_path):
    ds = reader(corpus, vocab)
    samples = [ds[i] for i in range(12)]
    path = P.write_hdf5(str(tmp_path / "part.hdf5"), samples, 32, 5)
    h5 = P.BertPretrainHDF5(files=[path])
    assert len(h5) == 12 and h5.describe(3).endswith("part.hdf5[3]")
    for i, s in enumerate(samples):
        t = h5[i]
        for k in P.SAMPLE_KEYS:
            np.testing.assert_array_equal(np.asarray(t[k]), np.asarray(s[k]), err_msg=k)


def test_pretraining_bad_input_is_one_line(tmp_path, vocab):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(ConfigError, match="no sentences"):
        P.BertPretrainText(files=[str(empty)], vocab_file=vocab)
    with pytest.raises(ConfigError, match="corpus file not found"):
        P.BertPretrainText(files=[str(tmp_path / "nope.txt")], vocab_file=vocab)
    import h5py
    bad = tmp_path / "bad.hdf5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("input_ids", data=np.zeros((2, 4), np.int32))
    with pytest.raises(ConfigError, match="no dataset 'input_mask'"):
        P.BertPretrainHDF5(files=[str(bad)])


# ------------------------------------------------------------------------------- GLUE
# one line of each task's train/dev layout (columns as the GLUE download has them)
GLUE_ROWS = {
    "CoLA": (None, "gj04\t1\t\tThe sailors rode the breeze clear of the rocks."),
    "SST-2": ("sentence\tlabel", "hide new secretions from the parental units \t0"),
    "MRPC": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him as \"the witness\" ."),
    "STS-B": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
              "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000"),
    "QQP": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "133273\t213221\t213222\tHow is life?\tHow's life?\t1"),
    "MNLI": ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
             "0\t31193\t31193n\tgovernment\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tConceptually cream skimming.\tProduct and geography.\tneutral\tneutral"),
    "QNLI": ("index\tquestion\tsentence\tlabel", "0\tWhen?\tIn 1999 it was.\tentailment"),
    "RTE": ("index\tsentence1\tsentence2\tlabel", "0\tNo weapons found.\tWeapons found.\tnot_entailment"),
}
EXPECTED = {"CoLA": ("The sailors rode the breeze clear of the rocks.", None, 1),
            "SST-2": ("hide new secretions from the parental units ", None, 0),
            "MRPC": ("Amrozi accused his brother .", "Referring to him as \"the witness\" .", 1),
            "STS-B": ("A plane is taking off.", "An air plane is taking off.", 5.0),
            "QQP": ("How is life?", "How's life?", 1),
            "MNLI": ("Conceptually cream skimming.", "Product and geography.", 2),
            "QNLI": ("When?", "In 1999 it was.", 0),
            "RTE": ("No weapons found.", "Weapons found.", 1)}


def _write(path, header, rows):
    path.write_text("".join(line + "\n" for line in ([header] if header else []) + rows))
    return str(path)


@pytest.mark.parametrize("task", sorted(GLUE_ROWS))
def test_glue_reads_each_tasks_columns(task, tmp_path, vocab):
    header, row = GLUE_ROWS[task]
    path = _write(tmp_path / "train.tsv", header, [row])
    ds = GLUE(task=task, vocab_file=vocab, files=[path])
    guid, a, b, label = ds.rows[0]
    want_a, want_b, want_label = EXPECTED[task]
    assert (a, b) == (want_a, want_b)         # raw text, quotes kept
    s = ds[0]
    assert s["label"] == want_label and s["label"].dtype == (np.float32 if task == "STS-B" else np.int64)
    assert ds.num_classes == (1 if task == "STS-B" else len(TASKS[task].labels))
    assert s["input_ids"][0] == ds.tokenizer.cls_id and (s["token_type_ids"].max() == (0 if b is None else 1))


def test_glue_missing_column_and_unknown_label_are_one_line(tmp_path, vocab):
    header, _ = GLUE_ROWS["RTE"]
    path = _write(tmp_path / "train.tsv", header, ["0\tonly one sentence"])
    with pytest.raises(ConfigError, match=r"train.tsv:2: 2 tab-separated columns; GLUE RTE needs column 3 \('sentence2'\)"):
        GLUE(task="RTE", vocab_file=vocab, files=[path])
    path = _write(tmp_path / "train.tsv", header, ["0\ta\tb\tentailment", "1\ta\tb\tcontradiction"])
    with pytest.raises(ConfigError, match=r"train.tsv:3: label 'contradiction' is not one of RTE's labels"):
        GLUE(task="RTE", vocab_file=vocab, files=[path])
    with pytest.raises(ConfigError, match="GLUE task 'SST2' unknown \\(did you mean 'SST-2'\\?\\)"):
        GLUE(task="SST2", vocab_file=vocab, files=[path])


def test_mnli_reads_both_dev_sets_and_the_metric_reports_each(tmp_path, vocab):
    header, row = GLUE_ROWS["MNLI"]
    other = row.replace("\tneutral\tneutral", "\tentailment\tentailment")
    _write(tmp_path / "dev_matched.tsv", header, [row, row, other])
    _write(tmp_path / "dev_mismatched.tsv", header, [other, other])
    ds = GLUE(task="MNLI", vocab_file=vocab, data_dir=str(tmp_path), split="dev")
    assert len(ds) == 5 and [int(ds[i]["subset"]) for i in range(5)] == [0, 0, 0, 1, 1]
    metric = M.GLUEMetric()
    metric.set_dataset(ds)
    assert metric.names() == ["accuracy", "accuracy_mm", "num_samples"]
    # predictions: neutral (2) everywhere: matched 2 of 3 right, mismatched 0 of 2
    logits = np.tile(np.array([[0.0, 0.0, 1.0]], np.float32), (5, 1))
    metric.update({"logits": logits}, {"index": np.arange(5), "label": np.array([ds[i]["label"] for i in range(5)]),
                                       "subset": np.array([0, 0, 0, 1, 1])})
    out = metric.accumulate()
    assert out["accuracy"] == pytest.approx(2 / 3) and out["accuracy_mm"] == 0.0 and out["num_samples"] == 5


def test_glue_metrics_by_hand():
    pred = np.array([1, 1, 0, 0, 1, 0])
    label = np.array([1, 0, 0, 1, 1, 0])
    # tp 2, fp 1, fn 1, tn 2
    assert M.accuracy(pred, label) == pytest.approx(4 / 6)
    assert M.f1(pred, label) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert M.mcc(pred, label) == pytest.approx((2 * 2 - 1 * 1) / np.sqrt(3 * 3 * 3 * 3))
    assert M.mcc(np.ones(4), np.array([1, 0, 1, 0])) == 0.0       # a constant prediction
    assert M.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    # ranks with ties: x -> [1, 2.5, 2.5, 4], y -> [1, 2, 3, 4]; pearson of those
    rx, ry = np.array([1, 2.5, 2.5, 4]), np.array([1, 2, 3, 4.0])
    want = ((rx - rx.mean()) * (ry - ry.mean())).sum() / np.sqrt(((rx - rx.mean()) ** 2).sum() * ((ry - ry.mean()) ** 2).sum())
    assert M.spearman([10, 20, 20, 30], [1, 2, 3, 4]) == pytest.approx(want)
    np.testing.assert_array_equal(M.average_ranks([3, 1, 3, 2]), [3.5, 1, 3.5, 2])


def test_pretraining_metric_counts_tokens_not_samples():
    m = M.PretrainingMetric()
    m.update({"mlm_correct": np.array([1.0, 0.0]), "mlm_total": np.array([2.0, 3.0]),
              "nsp_logits": np.array([[1.0, 0.0], [0.0, 1.0]])}, {"index": np.array([0, 1]), "next_sentence_label": np.array([0, 0])})
    out = m.accumulate()
    assert out == {"mlm_acc": pytest.approx(1 / 5), "nsp_acc": 0.5, "num_samples": 2}


def test_submission_files(tmp_path, vocab):
    _write(tmp_path / "test_matched.tsv", "index\tpromptID\tpairID\tgenre\tp1\tp2\tp3\tp4\tsentence1\tsentence2",
           ["7\t1\t1\tg\t-\t-\t-\t-\tA.\tB.", "8\t1\t1\tg\t-\t-\t-\t-\tC.\tD."])
    _write(tmp_path / "test_mismatched.tsv", "index\tpromptID\tpairID\tgenre\tp1\tp2\tp3\tp4\tsentence1\tsentence2",
           ["9\t1\t1\tg\t-\t-\t-\t-\tE.\tF."])
    ds = GLUE.for_inputs([str(tmp_path / "test_matched.tsv"), str(tmp_path / "test_mismatched.tsv")],
                         task="MNLI", vocab_file=vocab)
    assert "label" not in ds[0] and [ds.describe(i) for i in range(3)] == ["7", "8", "9"]
    w = O.GLUESubmission()
    w.open(str(tmp_path / "out"), ds)
    meta = {"index": np.array([2, 0, 1]), "guid": ["9", "7", "8"], "subset": np.array([1, 0, 0])}
    lines = w.write({"logits": np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1]], np.float32)}, meta)
    assert lines == ["9\tentailment", "7\tcontradiction", "8\tneutral"]
    files = w.close()
    assert [os.path.basename(f) for f in files] == ["MNLI-m.tsv", "MNLI-mm.tsv"]
    assert open(files[0]).read() == "index\tprediction\n7\tcontradiction\n8\tneutral\n"
    assert open(files[1]).read() == "index\tprediction\n9\tentailment\n"


def test_pretraining_scores_writer(tmp_path, corpus, vocab):
    ds = P.BertPretrainText.for_inputs([corpus], vocab_file=vocab, max_seq_length=32)
    w = O.PretrainingScores()
    w.open(str(tmp_path), ds)
    lines = w.write({"nsp_logits": np.array([[0.0, 0.0], [np.log(3.0), 0.0]]), "mlm_correct": np.array([1.0, 2.0]),
                     "mlm_total": np.array([3.0, 2.0])}, {"index": np.array([1, 0]), "id": [ds.describe(1), ds.describe(0)]})
    assert lines[0] == f"{ds.describe(1)}: 1/3 masked tokens, P(is next) 0.5" and ds.describe(0).endswith("corpus.txt:1")
    (path,) = w.close()
    rows = [__import__("json").loads(line) for line in open(path)]
    assert [r["id"] for r in rows] == [ds.describe(0), ds.describe(1)] and rows[0]["p_is_next"] == 0.75
