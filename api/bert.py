"""BERT from Python: `load_bert(folder_or_entry)`, `load_tokenizer(folder)` and
`sentence_embeddings(model, tokenizer, sentences)`.

    from api.bert import load_bert, load_tokenizer, sentence_embeddings
    model = load_bert("path/to/all-MiniLM-L6-v2")
    emb = sentence_embeddings(model, load_tokenizer("path/to/all-MiniLM-L6-v2"), ["A man is eating food."])
"""
import json
import os

import numpy as np
import paddle

from engine.errors import ConfigError
from engine.weights.pretrained import WEIGHTS, load_pretrained, read_folder_config
from models.nlp.bert import (CONFIG_KEYS, BertForPretraining, BertForSequenceClassification, BertModel,
                             check_model_type)
from readers.tokenization import BertTokenizer

HF_TO_ARGS = {k: k for k in CONFIG_KEYS + ("hidden_dropout_prob", "attention_probs_dropout_prob",
                                           "initializer_range", "pad_token_id")}
TASKS = {"encoder": BertModel, "pretraining": BertForPretraining,
         "classification": BertForSequenceClassification}


def load_bert(name_or_folder, task="encoder", log=None, **overrides):
    """A BERT with weights, in eval mode: from a Hugging Face folder (config.json + model.safetensors),
    one of our checkpoints or `.pdparams` files (give the settings in `overrides`), or an entry name.

    `task`: 'encoder' (BertModel), 'pretraining' or 'classification' (pass num_classes=...).
    """
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
