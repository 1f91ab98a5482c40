"""BERT's weight layouts: the PaddleNLP releases (entries), the Hugging Face names and our task-model
files read by the bare encoder (layouts that are not downloadable entries), as key maps and
conversions of a state dict; no file is read here (engine/weights/pretrained.py reads them).

models/nlp/bert.py names the layouts in its models' `weights()`.
"""
import numpy as np

from engine.weights.pretrained import WEIGHTS, PretrainedEntry


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
