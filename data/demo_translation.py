"""A generated parallel corpus for the Transformer demo: a small English fragment translated into a
synthetic language by a deterministic grammar that needs attention, reordering and agreement.

English (SVO):   [the|a|some] ADJ* NOUN VERB [the|a|some] ADJ* NOUN [PREP [the|a|some] ADJ* NOUN] .
Target (SOV):    DET NOUN ADJ* (adjectives mirrored) for each noun phrase, in the order
                 subject, prepositional phrase (postposition after it), object + the marker `ko`, verb.
Agreement: every noun has a gender; articles and adjectives agree with their noun in gender and
number, nouns take a plural ending by gender, and the verb at the end of the sentence agrees with
the subject's number (which may be ten words back). A word-for-word translation in source order
therefore gets most words' stems but few of their forms, and almost no word order.

Files under the output folder: `{train,valid,test}.{en,xx}` (one sentence per line), `train.align`
(word alignments in the Pharaoh `i-j` format, source token i to target token j, the final `.` being
a token) and `spm.model`/`spm.vocab` (a joint sentencepiece BPE model trained on train.en + train.xx
with data/spm_train.py). `word_for_word_bleu(folder)` is the monotone baseline the README and the tests
report beside the model.
"""
import collections
import os

import numpy as np
import sacrebleu

from data.spm_train import train

NOUNS = ["dog", "cat", "bird", "horse", "frog", "farmer", "teacher", "girl", "boy", "king", "queen",
         "doctor", "baker", "singer", "sailor", "student", "house", "tree", "river", "garden", "book",
         "car", "boat", "apple", "table", "chair", "window", "door", "bridge", "mountain", "flower",
         "road", "lamp", "letter", "song", "ship", "stone", "wall", "forest", "field"]
ADJECTIVES = ["big", "small", "red", "green", "old", "young", "happy", "sad", "tall", "short", "quiet",
              "loud", "dark", "bright", "cold", "warm"]
VERBS = ["see", "like", "find", "help", "follow", "paint", "visit", "call", "draw", "hold", "need",
         "want", "love", "know", "meet", "read"]
PREPOSITIONS = ["near", "with", "under", "behind", "above"]

# target function words: article[definite][gender][number]
ARTICLES = {True: {"m": ("lo", "li"), "f": ("la", "le")}, False: {"m": ("un", "dei"), "f": ("una", "dee")}}
ADJ_ENDINGS = {"m": ("o", "i"), "f": ("a", "e")}
NOUN_PLURAL = {"m": "en", "f": "ar"}
VERB_ENDINGS = ("et", "ont")      # singular / plural subject
OBJECT_MARKER = "ko"

SIZES = {"train": 12000, "valid": 400, "test": 200}
VOCAB_SIZE = 320


def _pseudo_words(rng, n, taken, syllables=(2, 3), final_consonant=True):
    cons, vows = "bdfgklmnprstvz", "aeiou"
    out = []
    while len(out) < n:
        k = int(rng.integers(syllables[0], syllables[1] + 1))
        w = "".join(cons[rng.integers(len(cons))] + vows[rng.integers(len(vows))] for _ in range(k))
        if final_consonant:
            w += "nrst"[rng.integers(4)]
        if w not in taken and w != OBJECT_MARKER:
            taken.add(w)
            out.append(w)
    return out


def lexicon(seed=0):
    """The fixed target vocabulary: noun stems with genders, adjective and verb stems, postpositions."""
    rng = np.random.default_rng([seed, 1])
    taken = set()
    nouns = _pseudo_words(rng, len(NOUNS), taken, final_consonant=False)
    genders = ["m" if g else "f" for g in rng.integers(0, 2, len(NOUNS))]
    return {
        "noun": {en: (stem, g) for en, stem, g in zip(NOUNS, nouns, genders)},
        "adj": dict(zip(ADJECTIVES, _pseudo_words(rng, len(ADJECTIVES), taken))),
        "verb": dict(zip(VERBS, _pseudo_words(rng, len(VERBS), taken))),
        "prep": dict(zip(PREPOSITIONS, _pseudo_words(rng, len(PREPOSITIONS), taken, syllables=(1, 2)))),
    }


def _noun_phrase(rng, lex):
    """(English tokens, target tokens, alignment pairs within the phrase, plural)."""
    noun = NOUNS[rng.integers(len(NOUNS))]
    plural = bool(rng.random() < 0.35)
    definite = bool(rng.random() < 0.6)
    adjs = list(rng.choice(ADJECTIVES, size=int(rng.choice([0, 1, 2], p=[0.4, 0.4, 0.2])), replace=False))
    stem, gender = lex["noun"][noun]
    det_en = "the" if definite else ("some" if plural else "a")
    src = [det_en] + adjs + [noun + ("s" if plural else "")]
    det = ARTICLES[definite][gender][int(plural)]
    tgt_noun = stem + (NOUN_PLURAL[gender] if plural else "")
    tgt_adjs = [lex["adj"][a] + ADJ_ENDINGS[gender][int(plural)] for a in reversed(adjs)]
    tgt = [det, tgt_noun] + tgt_adjs
    n = len(adjs)
    align = [(0, 0), (n + 1, 1)] + [(1 + i, 2 + (n - 1 - i)) for i in range(n)]
    return src, tgt, align, plural


def sentence(rng, lex):
    """One (English, target, alignment) triple."""
    subj, obj = _noun_phrase(rng, lex), _noun_phrase(rng, lex)
    verb = VERBS[rng.integers(len(VERBS))]
    pp = _noun_phrase(rng, lex) if rng.random() < 0.5 else None
    prep = PREPOSITIONS[rng.integers(len(PREPOSITIONS))] if pp else None
    src, tgt, align = [], [], []

    def put(part_src_offset, part_tgt_offset, pairs):
        align.extend((i + part_src_offset, j + part_tgt_offset) for i, j in pairs)

    # source order: subject, verb, object, [prep, pp]
    s_subj, s_verb = 0, len(subj[0])
    s_obj = s_verb + 1
    s_prep = s_obj + len(obj[0])
    src = subj[0] + [verb if subj[3] else verb + "s"] + obj[0]
    if pp:
        src += [prep] + pp[0]
    # target order: subject, [pp, postposition], object, ko, verb
    tgt = list(subj[1])
    put(s_subj, 0, subj[2])
    if pp:
        put(s_prep + 1, len(tgt), pp[2])
        tgt += pp[1]
        align.append((s_prep, len(tgt)))
        tgt.append(lex["prep"][prep])
    put(s_obj, len(tgt), obj[2])
    tgt += obj[1] + [OBJECT_MARKER]
    align.append((s_verb, len(tgt)))
    tgt.append(lex["verb"][verb] + VERB_ENDINGS[int(subj[3])])
    align.append((len(src), len(tgt)))   # the final '.'
    return " ".join(src) + ".", " ".join(tgt) + ".", sorted(align)


def tokens(line):
    """Words and the final '.' as tokens (the alignment's units)."""
    return line[:-1].split() + ["."] if line.endswith(".") else line.split()


def make(root, seed=0, sizes=None, vocab_size=VOCAB_SIZE):
    """Write the corpus and its sentencepiece model under `root` once; returns `root`."""
    done = os.path.join(root, "DONE")
    if os.path.isfile(done):
        return root
    os.makedirs(root, exist_ok=True)
    lex = lexicon(seed)
    sizes = sizes or SIZES
    seen = set()
    for split, n in sizes.items():
        rng = np.random.default_rng([seed, 2, list(SIZES).index(split) if split in SIZES else 9])
        rows = []
        while len(rows) < n:
            en, xx, align = sentence(rng, lex)
            if en in seen:   # held-out sentences never occur in training
                continue
            seen.add(en)
            rows.append((en, xx, align))
        for ext, col in (("en", 0), ("xx", 1)):
            with open(os.path.join(root, f"{split}.{ext}"), "w", encoding="utf-8") as f:
                f.writelines(r[col] + "\n" for r in rows)
        if split == "train":
            with open(os.path.join(root, "train.align"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(f"{i}-{j}" for i, j in r[2]) + "\n" for r in rows)
    train([os.path.join(root, "train.en"), os.path.join(root, "train.xx")], os.path.join(root, "spm"), vocab_size)
    with open(done, "w") as f:
        f.write("ok\n")
    return root


def word_for_word_bleu(root, split="valid"):
    """The monotone word-for-word baseline: each English token replaced by the target token it is most
    often aligned to in train.align (the gold alignments: the best lexicon such a baseline can have),
    in English order; unaligned target words (the object marker) never appear. Returns sacrebleu's
    BLEU (0-100) of `split` against its references, and the baseline's lines."""
    counts = collections.defaultdict(collections.Counter)
    with open(os.path.join(root, "train.en"), encoding="utf-8") as fe, \
            open(os.path.join(root, "train.xx"), encoding="utf-8") as fx, \
            open(os.path.join(root, "train.align"), encoding="utf-8") as fa:
        for en, xx, al in zip(fe, fx, fa):
            s, t = tokens(en.strip()), tokens(xx.strip())
            for pair in al.split():
                i, j = map(int, pair.split("-"))
                counts[s[i]][t[j]] += 1
    best = {w: c.most_common(1)[0][0] for w, c in counts.items()}
    with open(os.path.join(root, f"{split}.en"), encoding="utf-8") as f:
        sources = [line.strip() for line in f]
    with open(os.path.join(root, f"{split}.xx"), encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    hyps = []
    for line in sources:
        words = [best.get(w, w) for w in tokens(line)]
        text = " ".join(w for w in words if w != ".")
        hyps.append(text + "." if "." in words else text)
    return sacrebleu.corpus_bleu(hyps, [refs]).score, hyps
