"""Readers: one file per dataset format (engine.data.SampleDataset, DATASETS), and the transforms (TRANSFORMS).

COMPONENTS lists the modules that register, in order (engine/components.py imports them); helpers
that register nothing (decoding, fields, tfrecord, tokenization) are imported by the modules that use
them.
"""
COMPONENTS = ("youtube8m", "kinetics", "coco", "detection_transforms", "transforms", "image_transforms",
              "segmentation", "video_transforms", "translation", "bert_pretrain", "glue")
