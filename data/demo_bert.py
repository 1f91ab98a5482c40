"""Demo data for BERT, in the real formats: a pretraining corpus and a GLUE-format sentence-pair task.

Both come from one small grammar, so what a model must learn is known:
- Corpus (`corpus/train.txt`, `corpus/val.txt`: one sentence per line, blank line between
  documents). A document is about one noun and one place; each noun has its own two adjectives and
  two verbs, while determiners, adverbs and prepositions are drawn at random. So a masked noun is
  predictable from its adjective, its verb or the other sentences of the document, an adjective or
  verb from its noun, a place from the document, and the next sentence of a document is about the
  same noun as the one before (what NSP can learn). Half of the documents count ("... five times
  ...", then six, seven ...), so the order of the number words is learnable from context, and a
  counting sentence tells which one comes next; frequency alone predicts little
  (`stats.json` records the most frequent token's share of the maskable tokens).
- Pair task (`glue/{train,dev,test}.tsv`, RTE's columns: index, sentence1, sentence2, label; only
  100 labelled training pairs): sentence 1 is a sentence of a new document made as the corpus's,
  sentence 2 the sentence after it (`entailment`) or, with probability 1/2, a sentence of another
  document (`not_entailment`). That is next-sentence prediction on single sentences: pretraining on
  the corpus learns it, 100 pairs are too few to learn it from scratch, and either sentence alone
  says nothing about it.
- `vocab.txt`: [PAD], [UNK], [CLS], [SEP], [MASK] and the grammar's words; `vocab_30522.txt`: the
  same first lines padded with [unused] entries to BERT-base's 30,522 (to benchmark the full-size
  model on this corpus).
"""
import json
import os

import numpy as np

# noun -> (its two adjectives, its two verbs); nouns grouped by kind (the pair task's label)
KINDS = {
    "animal": {"cat": ("furry", "sleepy", "purrs", "naps"), "dog": ("loyal", "noisy", "barks", "fetches"),
               "horse": ("strong", "wild", "gallops", "neighs"), "bird": ("tiny", "colorful", "sings", "flies"),
               "fox": ("clever", "red", "sneaks", "hunts"), "wolf": ("grey", "hungry", "howls", "prowls"),
               "bear": ("huge", "brown", "growls", "fishes"), "mouse": ("shy", "quick", "squeaks", "nibbles")},
    "vehicle": {"car": ("fast", "shiny", "honks", "speeds"), "bus": ("crowded", "yellow", "stops", "rumbles"),
                "truck": ("heavy", "loud", "hauls", "reverses"), "train": ("long", "late", "departs", "whistles"),
                "boat": ("small", "wooden", "sails", "drifts"), "plane": ("silver", "private", "lands", "soars"),
                "bike": ("rusty", "light", "rattles", "coasts"), "tram": ("electric", "old", "clangs", "turns")},
    "plant": {"tree": ("tall", "ancient", "grows", "sways"), "rose": ("fragrant", "thorny", "blooms", "wilts"),
              "fern": ("green", "damp", "unfurls", "spreads"), "oak": ("mighty", "twisted", "creaks", "stands"),
              "tulip": ("pink", "fresh", "opens", "droops"), "cactus": ("spiky", "dry", "thrives", "survives"),
              "vine": ("climbing", "tangled", "creeps", "twines"), "moss": ("soft", "thick", "covers", "clings")},
}
DETS = ("the", "a", "this", "my")
ADVS = ("today", "again", "often", "slowly", "quietly", "suddenly", "now", "later")
PREPS = ("in", "near", "behind", "under", "beside", "past")
NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
PLACES = ("park", "city", "house", "field", "river", "road", "garden", "forest", "village", "hill")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def vocabulary():
    words = set(DETS + ADVS + PREPS + PLACES + NUMBERS + ("and", "is", "it", "times", "."))
    for nouns in KINDS.values():
        for noun, words_of in nouns.items():
            words.update((noun,) + words_of)
    return SPECIALS + sorted(words)


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def sentence(rng, kind, noun, place=None):
    adj1, adj2, verb1, verb2 = KINDS[kind][noun]
    adj, verb = _pick(rng, (adj1, adj2)), _pick(rng, (verb1, verb2))
    place = place or _pick(rng, PLACES)
    form = int(rng.integers(3))
    if form == 0:
        words = [_pick(rng, DETS), adj, noun, verb, _pick(rng, PREPS), "the", place]
    elif form == 1:
        words = [_pick(rng, DETS), noun, "is", adj, "and", "it", verb, _pick(rng, ADVS)]
    else:
        words = [_pick(rng, ADVS), _pick(rng, DETS), adj, noun, verb]
    return " ".join(words) + " ."


def _documents(rng, n_docs):
    """A document: one noun and one place throughout (so other sentences tell a masked one); half
    of them count: "... N times ...", N one more in every sentence."""
    docs = []
    for _ in range(n_docs):
        kind = _pick(rng, sorted(KINDS))
        noun, place = _pick(rng, sorted(KINDS[kind])), _pick(rng, PLACES)
        n = int(rng.integers(3, 8))
        if rng.random() < 0.5:
            start = int(rng.integers(1, len(NUMBERS) - n + 2))
            docs.append([_counted(rng, start + k, kind, noun) for k in range(n)])
        else:
            docs.append([sentence(rng, kind, noun, place) for _ in range(n)])
    return docs


def _pairs(rng, n):
    """Sentence 1 from a new document, sentence 2 the sentence after it or (probability 1/2) a sentence
    of another document: `entailment` when it continues. The documents are made as the corpus's, so
    what tells the two apart (the noun, its adjectives and verbs, the place, the count) is what NSP
    pretraining on the corpus learns; 100 labelled pairs are too few to learn it from scratch."""
    rows = []
    for i in range(n):
        doc, other = _documents(rng, 2)
        k = int(rng.integers(len(doc) - 1))
        follows = rng.random() < 0.5
        s2 = doc[k + 1] if follows else _pick(rng, other)
        rows.append((i, doc[k], s2, "entailment" if follows else "not_entailment"))
    return rows


def _counted(rng, count, kind=None, noun=None):
    kind = kind or _pick(rng, sorted(KINDS))
    noun = noun or _pick(rng, sorted(KINDS[kind]))
    adj1, adj2, verb1, verb2 = KINDS[kind][noun]
    return " ".join([_pick(rng, DETS), _pick(rng, (adj1, adj2)), noun, _pick(rng, (verb1, verb2)),
                     NUMBERS[count - 1], "times", _pick(rng, ADVS)]) + " ."


def _write_lines(path, lines):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(path + ".tmp", path)


def make(root, seed=0, train_docs=600, val_docs=120, train_pairs=100, dev_pairs=400, test_pairs=100):
    """Write the demo data under `root` once (a DONE marker holding the parameters makes later calls
    with the same parameters no-ops); returns root."""
    params = {"version": 2, "seed": seed, "train_docs": train_docs, "val_docs": val_docs,
              "train_pairs": train_pairs, "dev_pairs": dev_pairs, "test_pairs": test_pairs}
    done = os.path.join(root, "DONE")
    if os.path.exists(done):
        with open(done) as f:
            text = f.read()
        if text and json.loads(text) == params:
            return root
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "corpus"), exist_ok=True)
    os.makedirs(os.path.join(root, "glue"), exist_ok=True)
    vocab = vocabulary()
    _write_lines(os.path.join(root, "vocab.txt"), vocab)
    _write_lines(os.path.join(root, "vocab_30522.txt"),
                 vocab + [f"[unused{i}]" for i in range(30522 - len(vocab))])
    counts = {}
    for name, n in (("train", train_docs), ("val", val_docs)):
        docs = _documents(rng, n)
        lines = []
        for doc in docs:
            lines += doc + [""]
            if name == "train":
                for s in doc:
                    for w in s.split():
                        counts[w] = counts.get(w, 0) + 1
        _write_lines(os.path.join(root, "corpus", f"{name}.txt"), lines[:-1])
    for name, n in (("train", train_pairs), ("dev", dev_pairs), ("test", test_pairs)):
        rows = _pairs(rng, n)
        header = "index\tsentence1\tsentence2" + ("" if name == "test" else "\tlabel")
        body = ["\t".join(map(str, r if name != "test" else r[:3])) for r in rows]
        _write_lines(os.path.join(root, "glue", f"{name}.tsv"), [header] + body)
    top = max(counts, key=counts.get)
    stats = {"most_frequent_token": top, "most_frequent_token_rate": counts[top] / sum(counts.values()),
             "vocab_size": len(vocab)}
    with open(os.path.join(root, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    with open(done, "w") as f:
        json.dump(params, f)
    return root


if __name__ == "__main__":
    import sys
    print(make(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "bert_demo")))
