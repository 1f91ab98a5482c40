"""The one explicit list of component modules. Add a new model, reader, transform, metric or output
writer file here.

Importing a module registers what it defines; `load_all()` is called by the tools and the tests,
never at import time of the engine itself.
"""
import importlib

COMPONENT_MODULES = [
    "engine.data",
    "engine.training.samplers",
    "engine.training.optim",
    "readers.youtube8m",
    "readers.kinetics",
    "readers.coco",
    "readers.detection_transforms",
    "readers.transforms",
    "readers.image_transforms",
    "readers.segmentation",
    "readers.video_transforms",
    "readers.translation",
    "readers.bert_pretrain",
    "readers.glue",
    "metrics.youtube8m",
    "metrics.classification",
    "metrics.segmentation",
    "metrics.detection",
    "metrics.translation",
    "metrics.glue",
    "outputs.youtube8m",
    "outputs.classification",
    "outputs.segmentation",
    "outputs.detection",
    "outputs.translation",
    "outputs.glue",
    "models.vision.resnet",
    "models.vision.deeplabv3",
    "models.video.attention_lstm",
    "models.video.nextvlad",
    "models.video.attention_cluster",
    "models.video.tsn",
    "models.video.stnet",
    "models.nlp.transformer",
    "models.nlp.bert_weights",
    "models.nlp.bert",
    "models.vision.mask_rcnn.model",
]

_loaded = False


def load_all():
    global _loaded
    if not _loaded:
        for name in COMPONENT_MODULES:
            importlib.import_module(name)
        _loaded = True
