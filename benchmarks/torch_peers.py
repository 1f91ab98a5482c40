"""PyTorch eager reference steps at our recipes' shapes (the `theirs` side of benchmarks/peers.py).

Plain torch (no torchvision: its PyPI wheels do not load against the CPU torch build here), NCHW,
no torch.compile. Each builder returns (model, optimizer, step_fn(batch) -> loss tensor) for a batch
of numpy arrays made by `benchmarks.peers.make_batch` (the same arrays our side gets); `autocast`
runs the step under torch.autocast("cpu", bfloat16). The
architectures and hyper-parameters are those of our recipes (see each builder), so a step does the
same arithmetic in both frameworks.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def _t(batch):
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def _step(model, optimizer, loss_fn, clip=None, autocast=False):
    """`autocast`: the forward (and so its backward) under torch.autocast("cpu", bfloat16), as a new
    user would write it: matmul, linear and convolution in bf16, norms and losses in fp32."""
    def step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model, _t(batch))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


# ------------------------------------------------------------------------------------------ BERT
class BertPretrain(nn.Module):
    """HF BertModel + the pretraining heads at the masked positions only (as our BertForPretraining,
    PaddleNLP and Google's original: the MLM decoder runs on the gathered positions)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import BertConfig, BertModel   # optional (benchmarks/requirements.txt): BERT's peer only
        self.bert = BertModel(BertConfig(**cfg))
        h = cfg["hidden_size"]
        self.transform = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h, eps=cfg["layer_norm_eps"])
        self.decoder_bias = nn.Parameter(torch.zeros(cfg["vocab_size"]))
        self.nsp = nn.Linear(h, 2)

    def forward(self, b):
        out = self.bert(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                        attention_mask=b["input_ids_mask"])
        seq, pooled = out.last_hidden_state, out.pooler_output
        B, S, H = seq.shape
        labels = b["masked_lm_ids"]
        valid = labels >= 0
        flat = (b["masked_lm_positions"] + torch.arange(B).unsqueeze(1) * S)[valid]
        hid = self.norm(F.gelu(self.transform(seq.reshape(-1, H)[flat])))
        logits = hid @ self.bert.embeddings.word_embeddings.weight.t() + self.decoder_bias
        mlm = F.cross_entropy(logits, labels[valid])
        return mlm + F.cross_entropy(self.nsp(pooled), b["next_sentence_label"])


def bert(spec, autocast=False):
    cfg = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
               intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
               layer_norm_eps=1e-12)
    model = BertPretrain(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    return model, opt, _step(model, opt, lambda m, b: m(b), autocast=autocast)


# ------------------------------------------------------------------------------------ Transformer
class Seq2Seq(nn.Module):
    """nn.Transformer pre-norm (norm_first, final LayerNorms), shared scaled embeddings tied to the
    output projection, sinusoid positions, label-smoothed cross entropy over non-pad tokens."""

    def __init__(self, vocab=33712, d=512, heads=8, ffn=2048, layers=6, dropout=0.1, max_len=257, pad=0):
        super().__init__()
        self.d, self.pad = d, pad
        self.emb = nn.Embedding(vocab, d, padding_idx=pad)
        nn.init.normal_(self.emb.weight, 0.0, d ** -0.5)
        half = d // 2
        inv = np.exp(np.arange(half) * -(math.log(1e4) / max(half - 1, 1)))
        ang = np.arange(max_len)[:, None] * inv[None]
        self.register_buffer("pos", torch.tensor(np.concatenate([np.sin(ang), np.cos(ang)], 1), dtype=torch.float32))
        self.body = nn.Transformer(d, heads, layers, layers, ffn, dropout, batch_first=True, norm_first=True)
        self.dropout = dropout

    def embed(self, ids, mask):
        pos = torch.arange(ids.shape[1]).unsqueeze(0) * mask.long()
        return F.dropout(self.emb(ids) * self.d ** 0.5 + self.pos[pos], self.dropout, self.training)

    def forward(self, b):
        src_mask, tgt_mask = b["src_ids_mask"], b["tgt_in_mask"]
        t = b["tgt_in"].shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        h = self.body(self.embed(b["src_ids"], src_mask), self.embed(b["tgt_in"], tgt_mask), tgt_mask=causal,
                      src_key_padding_mask=src_mask == 0, memory_key_padding_mask=src_mask == 0)
        logits = h @ self.emb.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["tgt_out"].reshape(-1),
                               ignore_index=self.pad, label_smoothing=0.1)


def transformer(spec, autocast=False):
    model = Seq2Seq().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.997), eps=1e-9)
    return model, opt, _step(model, opt, lambda m, b: m(b), autocast=autocast)


# ------------------------------------------------------------------------------------------ ResNet
class ConvBN(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, dilation=1, act=True, avg_down=False):
        mods = [nn.AvgPool2d(2, 2, ceil_mode=True)] if avg_down else []
        mods += [nn.Conv2d(cin, cout, k, stride, dilation * (k - 1) // 2, dilation, bias=False), nn.BatchNorm2d(cout)]
        if act:
            mods.append(nn.ReLU(inplace=True))
        super().__init__(*mods)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride, dilation, project, vd):
        super().__init__()
        self.body = nn.Sequential(ConvBN(cin, width, 1), ConvBN(width, width, 3, stride, dilation),
                                  ConvBN(width, width * 4, 1, act=False))
        if not project:
            self.short = None
        elif vd and stride != 1:
            self.short = ConvBN(cin, width * 4, 1, act=False, avg_down=True)
        else:
            self.short = ConvBN(cin, width * 4, 1, stride, act=False)

    def forward(self, x):
        return F.relu(self.body(x) + (x if self.short is None else self.short(x)))


class ResNet50(nn.Module):
    """ResNet-50 as models/vision/resnet.py builds it: variant b (7x7 stem, stride in the 3x3) or d
    (3x3 x3 stem, avg-pool shortcut), output stride 32 or 8 (dilated stages, multi-grid)."""

    def __init__(self, vd=False, output_stride=32, multi_grid=(1, 1, 1)):
        super().__init__()
        self.stem = nn.Sequential(ConvBN(3, 32, 3, 2), ConvBN(32, 32, 3), ConvBN(32, 64, 3)) if vd \
            else ConvBN(3, 64, 7, 2)
        dil = {32: [1, 1, 1, 1], 8: [1, 1, 2, 4]}[output_stride]
        stages, cin = [], 64
        for s, (n, w) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
            blocks = []
            for i in range(n):
                d = dil[s] * (multi_grid[i] if s == 3 else 1)
                stride = 2 if (i == 0 and s > 0 and dil[s] == 1) else 1
                blocks.append(Bottleneck(cin, w, stride, d, i == 0, vd))
                cin = w * 4
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.ModuleList(stages)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2, 1)
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats


class TSN(nn.Module):
    def __init__(self, num_classes=400):
        super().__init__()
        self.backbone = ResNet50()
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, b):
        imgs = b["imgs"]
        B, T = imgs.shape[:2]
        feat = self.backbone(imgs.reshape((-1,) + tuple(imgs.shape[2:])))[-1].mean((2, 3))
        logits = self.fc(F.dropout(feat.reshape(B, T, -1).mean(1), 0.4, self.training))
        return F.cross_entropy(logits, b["label"])


def tsn(spec, autocast=False, plain=False):
    """`plain`: a plain loop (peers.py --plain), without the recipe's clipping."""
    model = TSN().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    return model, opt, _step(model, opt, lambda m, b: m(b), clip=None if plain else 40.0, autocast=autocast)


class DeepLabV3(nn.Module):
    """R50-vd OS8 multi-grid (1, 2, 4), ASPP rates 1/12/24/36 + image pooling, 256 wide, dropout 0.1."""

    def __init__(self, num_classes=21, ch=256, rates=(1, 12, 24, 36)):
        super().__init__()
        self.backbone = ResNet50(vd=True, output_stride=8, multi_grid=(1, 2, 4))

        def cbr(cin, cout, k, d=1, bias=True):
            return nn.Sequential(nn.Conv2d(cin, cout, k, padding=d * (k - 1) // 2, dilation=d, bias=bias),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.branches = nn.ModuleList([cbr(2048, ch, 1 if r == 1 else 3, r) for r in rates])
        self.pool = cbr(2048, ch, 1, bias=False)
        self.project = cbr(ch * (len(rates) + 1), ch, 1)
        self.cls = nn.Conv2d(ch, num_classes, 1)

    def forward(self, b):
        x = b["image"]
        f = self.backbone(x)[-1]
        outs = [br(f) for br in self.branches]
        outs.append(F.interpolate(self.pool(F.adaptive_avg_pool2d(f, 1)), f.shape[2:], mode="bilinear",
                                  align_corners=False))
        y = F.dropout(self.project(torch.cat(outs, 1)), 0.1, self.training)
        logits = F.interpolate(self.cls(y), x.shape[2:], mode="bilinear", align_corners=False)
        return F.cross_entropy(logits, b["label"], ignore_index=255)


def deeplabv3(spec, autocast=False, plain=False):
    """`plain`: a plain loop (peers.py --plain): the same step, the recipe clips nothing."""
    model = DeepLabV3().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=4e-5)
    return model, opt, _step(model, opt, lambda m, b: m(b), autocast=autocast)


# ---------------------------------------------------------------------------------- AttentionLSTM
class AttentionLSTM(nn.Module):
    """Per modality fc -> tanh -> BiLSTM over the real frames -> dropout -> attention fc -> masked
    softmax -> weighted sum; fc 8192 relu, fc 4096 tanh, fc classes; BCE-with-logits summed."""

    def __init__(self, dims=(1024, 128), emb=512, hidden=1024, fc=(8192, 4096), classes=3862):
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(d, emb) for d in dims])
        self.lstms = nn.ModuleList([nn.LSTM(emb, hidden, batch_first=True, bidirectional=True) for _ in dims])
        self.atts = nn.ModuleList([nn.Linear(2 * hidden, 1) for _ in dims])
        self.out = nn.Sequential(nn.Linear(2 * hidden * len(dims), fc[0]), nn.ReLU(), nn.Linear(*fc), nn.Tanh(),
                                 nn.Linear(fc[1], classes))

    def forward(self, b, names=("rgb", "audio")):
        pooled = []
        for i, name in enumerate(names):
            x, lengths, mask = b[name], b[name + "_len"], b[name + "_mask"]
            emb = torch.tanh(self.fcs[i](x))
            packed = nn.utils.rnn.pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.lstms[i](packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
            out = F.dropout(out, 0.5, self.training)
            score = self.atts[i](out).squeeze(-1).masked_fill(mask == 0, float("-inf"))
            pooled.append((out * torch.softmax(score, 1).unsqueeze(-1)).sum(1))
        logits = self.out(torch.cat(pooled, 1))
        return F.binary_cross_entropy_with_logits(logits, b["labels"], reduction="sum")


def attention_lstm(spec, autocast=False):
    model = AttentionLSTM().train()
    opt = torch.optim.RMSprop(model.parameters(), lr=2.5e-4, centered=True, weight_decay=4e-4)
    return model, opt, _step(model, opt, lambda m, b: m(b), autocast=autocast)


BUILDERS = {"bert": bert, "transformer": transformer, "tsn": tsn, "deeplabv3": deeplabv3,
            "attention_lstm": attention_lstm}
