"""Video models: the YouTube-8M feature models and the RGB clip models (TSN, StNet)."""
COMPONENTS = ("attention_lstm", "nextvlad", "attention_cluster", "tsn", "stnet")
