"""NLP models: the Transformer (translation) and BERT (bert_weights.py: its pretrained entries and layouts)."""
COMPONENTS = ("transformer", "bert_weights", "bert")
