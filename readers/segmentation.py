"""Semantic segmentation readers: Cityscapes, Pascal VOC 2012 (+ SBD `trainaug`), a generic list.

A sample is `image` uint8 [H, W, 3] RGB and `label` [H, W] class ids, uint8 (int32 past 256 classes;
`ignore_index`, 255, where a pixel counts nowhere), declared as image and label fields so that the geometric transforms
move them together (labels with nearest neighbour). Inference inputs (`for_inputs`) have no label.

Label PNGs are read with Pillow: a palette PNG (VOC, our demo) gives its palette indices, which are
the class ids; cv2 would return the palette's colours. An RGB label PNG is refused.

One unreadable sample raises SampleError naming the file (with `skip_bad` it is skipped and
counted): an image that cannot be decoded, an image without its label PNG, a label of another
size than its image, label values that are neither a class nor the ignore index.
"""
import glob
import os
import typing

import numpy as np
from PIL import Image

from engine.errors import ConfigError, SampleError
from engine.data import SampleDataset
from engine.registry import DATASETS
from readers.decoding import read_image
from readers.fields import declare

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")

CITYSCAPES_CLASSES = ["road", "sidewalk", "building", "wall", "fence", "pole", "traffic light",
                      "traffic sign", "vegetation", "terrain", "sky", "person", "rider", "car", "truck",
                      "bus", "train", "motorcycle", "bicycle"]
# cityscapesscripts helpers/labels.py: label id -> train id for the 19 evaluated classes; the other
# ids (0-6 void, 9 parking, 10 rail track, 14 guard rail, 15 bridge, 16 tunnel, 18 polegroup,
# 29 caravan, 30 trailer) are ignored (train id 255). License plates (id -1) are not drawn in
# *_labelIds.png.
CITYSCAPES_TRAIN_IDS = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
                        24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}
CITYSCAPES_NUM_IDS = 34   # label ids 0..33

VOC_CLASSES = ["background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
               "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
               "sheep", "sofa", "train", "tvmonitor"]


def cityscapes_lut(ignore_index=255):
    """uint8 label id -> train id table (int32 [256]); -1 marks values that are not label ids."""
    lut = np.full(256, -1, np.int32)
    lut[:CITYSCAPES_NUM_IDS] = ignore_index
    for label_id, train_id in CITYSCAPES_TRAIN_IDS.items():
        lut[label_id] = train_id
    return lut


def read_label(path):
    """Class ids [H, W] (uint8, or int32 for 16/32-bit PNGs) of a palette or grey PNG, or SampleError."""
    if not os.path.isfile(path):
        raise SampleError(f"label PNG not found: {path}")
    try:
        with Image.open(path) as im:
            im.load()
            mode = im.mode
            if mode in ("RGB", "RGBA", "LA", "CMYK", "YCbCr", "HSV"):
                raise SampleError(f"label {path} is a {mode} colour image; a label PNG holds class ids "
                                  f"(palette or single-channel)")
            arr = np.asarray(im)
    except SampleError:
        raise
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), SyntaxError ...
        raise SampleError(f"cannot read label {path} ({type(e).__name__}: {' '.join(str(e).split())[:120]})")
    if arr.dtype == bool:
        arr = arr.astype(np.uint8)
    if arr.ndim != 2:
        raise SampleError(f"label {path} has shape {arr.shape}; expected [H, W] class ids")
    return arr if arr.dtype == np.uint8 else arr.astype(np.int32)


def _values(arr):
    """Sorted distinct values of an integer label map (bincount for uint8: fast on large maps)."""
    if arr.dtype == np.uint8:
        return np.flatnonzero(np.bincount(arr.reshape(-1), minlength=256))
    return np.unique(arr)


def _list(values, n=6):
    values = [int(v) for v in values]
    return ", ".join(map(str, values[:n])) + (", ..." if len(values) > n else "")


def find_images(inputs):
    """Image files among `inputs` (files, or folders searched recursively), in a stable order."""
    found = []
    for path in inputs:
        path = os.fspath(path)
        if os.path.isfile(path):
            found.append(path)
        elif os.path.isdir(path):
            found += sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                            if f.lower().endswith(IMAGE_EXTS))
        else:
            raise ConfigError(f"input not found: {path}")
    if not found:
        raise ConfigError(f"no images ({', '.join(IMAGE_EXTS)}) found in {', '.join(map(str, inputs))}")
    return found


class SegmentationDataset(SampleDataset):
    """Base of the segmentation readers: `items` is a list of (image path, label path or None).

    `label_lut(path)` may give a table (int32 [256], -1 for invalid raw values) that maps a label
    file's raw uint8 values to class ids before they are checked (Cityscapes label ids -> train ids).

    Args:
        ignore_index: the label value of pixels that are no class (void, borders, padding): losses and
            MeanIoU skip them; >= the number of classes.
    """

    def _setup(self, label_names, ignore_index, transforms, seed, skip_bad):
        SampleDataset.__init__(self, transforms=transforms, seed=seed, skip_bad=skip_bad)
        if ignore_index < 0:
            raise ConfigError(f"{type(self).__name__}.ignore_index must be >= 0, got {ignore_index}")
        self.label_names = list(label_names)
        self.num_classes = len(self.label_names)
        if ignore_index < self.num_classes:
            raise ConfigError(f"{type(self).__name__}: the ignore index {ignore_index} is one of the "
                              f"{self.num_classes} classes")
        self.ignore_index = ignore_index
        self.items = []

    def __len__(self):
        return len(self.items)

    def describe(self, index):
        return self.items[index][0]

    def load(self, index):
        image_path, label_path = self.items[index]
        image = read_image(image_path)
        sample = {"image": image}
        if label_path is None:
            return declare(sample, image="image")
        if not os.path.isfile(label_path):
            raise SampleError(f"label PNG not found for image {image_path}: {label_path}")
        label = read_label(label_path)
        if label.shape != image.shape[:2]:
            raise SampleError(f"label {label_path} is {label.shape[0]}x{label.shape[1]} but its image "
                              f"{image_path} is {image.shape[0]}x{image.shape[1]}")
        sample["label"] = self._check(self._map(label, label_path), label_path)
        return declare(sample, image="image", label="label")

    def label_lut(self, path):
        return None

    def _map(self, label, path):
        lut = self.label_lut(path)
        if lut is None:
            return label
        if label.dtype != np.uint8:
            raise SampleError(f"label {path} is not an 8-bit PNG ({label.dtype}); expected 8-bit label ids")
        mapped = lut[label]
        if (mapped < 0).any():
            bad = [v for v in _values(label) if lut[v] < 0]
            raise SampleError(f"label {path} has values {_list(bad)} that are not label ids "
                              f"({type(self).__name__})")
        return mapped

    def _check(self, label, path):
        values = _values(label)
        bad = [v for v in values if not (0 <= v < self.num_classes or v == self.ignore_index)]
        if bad:
            raise SampleError(f"label {path} has values {_list(bad)} outside the classes 0..{self.num_classes - 1} "
                              f"and not the ignore index {self.ignore_index}")
        # uint8 where the ids fit (ignore index 255, up to 256 classes): a quarter of the bytes that cross
        # the worker boundary; the model and the metric widen them
        fits = 0 <= self.ignore_index <= 255 and self.num_classes <= 256
        return label.astype(np.uint8 if fits else np.int32, copy=False)

    @classmethod
    def class_names(cls, **kwargs):
        """The class names a reader built with the recipe's arguments `kwargs` would have."""
        raise NotImplementedError

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """Unlabelled images (files, or folders searched recursively) with the recipe's test/val
        transforms and the class names of this reader."""
        ds = SegmentationDataset.__new__(SegmentationDataset)
        ds._setup(cls.class_names(**kwargs), kwargs.get("ignore_index", 255), kwargs.get("transforms"),
                  kwargs.get("seed", 0), kwargs.get("skip_bad", False))
        ds.items = [(p, None) for p in find_images(inputs)]
        return ds


@DATASETS.register("Cityscapes")
class Cityscapes(SegmentationDataset):
    """Cityscapes fine annotations, as unpacked from leftImg8bit_trainvaltest.zip and gtFine_trainvaltest.zip:

        root/leftImg8bit/<mode>/<city>/<stem>_leftImg8bit.png
        root/gtFine/<mode>/<city>/<stem>_gtFine_labelTrainIds.png   (19 train ids, 255 ignored) or
        root/gtFine/<mode>/<city>/<stem>_gtFine_labelIds.png        (label ids 0..33, mapped here)

    Images and labels are paired by file name, so a missing label is that image's error, not a
    shifted pairing.

    Args:
        root: the folder holding leftImg8bit/ and gtFine/.
        mode: the split read (its folder under leftImg8bit/ and gtFine/).
        label_type: `auto` takes the labelTrainIds PNGs where they exist (cityscapesscripts'
            createTrainIdLabelImgs writes them; PaddleSeg needs them), else the labelIds ones, mapped to
            the 19 train ids here; `trainIds` / `labelIds` force one.
    """

    SOURCE_KEYS = ("root", "mode")
    def __init__(self, root: str = "data/cityscapes", mode: typing.Literal["train", "val", "test"] = "train",
                 label_type: typing.Literal["auto", "trainIds", "labelIds"] = "auto",
                 ignore_index: int = 255, skip_bad: bool = False, transforms: list = None, seed: int = 0):
        if mode not in ("train", "val", "test"):
            raise ConfigError(f"Cityscapes.mode must be train, val or test, got '{mode}'")
        if label_type not in ("auto", "trainIds", "labelIds"):
            raise ConfigError(f"Cityscapes.label_type must be auto, trainIds or labelIds, got '{label_type}'")
        self._setup(CITYSCAPES_CLASSES, ignore_index, transforms, seed, skip_bad)
        img_dir = os.path.join(root, "leftImg8bit", mode)
        if not os.path.isdir(img_dir):
            raise ConfigError(f"Cityscapes: no folder {img_dir} (expected root/leftImg8bit/{mode}/<city>/)")
        images = sorted(glob.glob(os.path.join(img_dir, "*", "*_leftImg8bit.png")))
        if not images:
            raise ConfigError(f"Cityscapes: no *_leftImg8bit.png under {img_dir}/<city>/")
        self._lut = cityscapes_lut(ignore_index)
        for img in images:
            city = os.path.basename(os.path.dirname(img))
            stem = os.path.basename(img)[:-len("_leftImg8bit.png")]
            base = os.path.join(root, "gtFine", mode, city, stem + "_gtFine_")
            train_ids, label_ids = base + "labelTrainIds.png", base + "labelIds.png"
            use_train_ids = label_type == "trainIds" or (label_type == "auto" and os.path.exists(train_ids))
            self.items.append((img, train_ids if use_train_ids else label_ids))

    @classmethod
    def class_names(cls, **kwargs):
        return CITYSCAPES_CLASSES

    def label_lut(self, path):
        """label ids 0..33 -> train ids; *_labelTrainIds.png are read as they are."""
        return self._lut if path.endswith("_labelIds.png") else None


@DATASETS.register("PascalVOC")
class PascalVOC(SegmentationDataset):
    """Pascal VOC 2012 segmentation in the VOCdevkit layout PaddleSeg reads:

        root/VOC2012/JPEGImages/<id>.jpg, root/VOC2012/SegmentationClass/<id>.png (palette PNGs),
        root/VOC2012/ImageSets/Segmentation/{train,val,trainval}.txt
        trainaug: train.txt with SegmentationClass, plus aug.txt with SegmentationClassAug (the SBD
        images outside VOC's trainval; `python data/prepare_voc_sbd.py` writes both): 1464 + 9118.

    Args:
        root: the VOCdevkit folder (holding VOC2012/).
        mode: the image list read: an ImageSets/Segmentation list, or `trainaug` (train plus the SBD
            images of ImageSets/Segmentation/aug.txt).
        label_names: class names replacing the 21 VOC classes (background first) for data in the same
            layout (the demo).
    """

    MODES = ("train", "val", "trainval", "trainaug")

    SOURCE_KEYS = ("root", "mode")
    def __init__(self, root: str = "data/VOCdevkit", mode: typing.Literal[MODES] = "train", label_names: list = None,
                 ignore_index: int = 255, skip_bad: bool = False, transforms: list = None, seed: int = 0):
        if mode not in self.MODES:
            raise ConfigError(f"PascalVOC.mode must be one of {', '.join(self.MODES)}, got '{mode}'")
        self._setup(self.class_names(label_names=label_names), ignore_index, transforms, seed, skip_bad)
        voc = os.path.join(root, "VOC2012")
        sets = os.path.join(voc, "ImageSets", "Segmentation")
        lists = [("train.txt" if mode == "trainaug" else f"{mode}.txt", "SegmentationClass")]
        if mode == "trainaug":
            lists.append(("aug.txt", "SegmentationClassAug"))
        for list_name, label_dir in lists:
            path = os.path.join(sets, list_name)
            if not os.path.isfile(path):
                hint = " (run data/prepare_voc_sbd.py to make the SBD trainaug set)" \
                    if list_name == "aug.txt" else ""
                raise ConfigError(f"PascalVOC: image list not found: {path}{hint}")
            with open(path, encoding="utf-8") as f:
                ids = [ln.strip() for ln in f if ln.strip()]
            self.items += [(os.path.join(voc, "JPEGImages", i + ".jpg"), os.path.join(voc, label_dir, i + ".png"))
                           for i in ids]
        if not self.items:
            raise ConfigError(f"PascalVOC: the {mode} lists under {sets} are empty")

    @classmethod
    def class_names(cls, label_names=None, **kwargs):
        if label_names is not None and (not isinstance(label_names, (list, tuple)) or not label_names):
            raise ConfigError(f"PascalVOC.label_names must be a non-empty list of names, got {label_names!r}")
        return list(label_names) if label_names else VOC_CLASSES


@DATASETS.register("SegList")
class SegList(SegmentationDataset):
    """A list file of `image label` lines (paths relative to `data_root`, else to the list's folder),
    as PaddleSeg's generic Dataset; a line with the image alone is unlabelled (inference).

    Args:
        list_file: the list of samples, one `image label` line each (the image alone: unlabelled).
        data_root: the folder the list's relative paths resolve against (default: the list file's).
        num_classes: the number of classes, numbered 0..n-1, when `label_names` is not given.
        label_names: the class names (a list, or a file with one name per line; line i = class i).
        separator: what separates image and label on a line: None splits on whitespace (paths without
            spaces), else e.g. "|" or a tab, for file names holding spaces.
    """

    SOURCE_KEYS = ("list_file", "data_root")
    def __init__(self, list_file: str, data_root: str = None, num_classes: int = None,
                 label_names: list | str = None, separator: str = None, ignore_index: int = 255,
                 skip_bad: bool = False, transforms: list = None, seed: int = 0):
        self._setup(self.class_names(num_classes=num_classes, label_names=label_names), ignore_index,
                    transforms, seed, skip_bad)
        if not os.path.isfile(list_file):
            raise ConfigError(f"SegList list_file not found: {list_file}")
        root = data_root if data_root else os.path.dirname(os.path.abspath(list_file))
        with open(list_file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = [p.strip() for p in line.split(separator)] if separator else line.split()
                if len(parts) not in (1, 2):
                    hint = (" (file names with spaces? write 'image|label' lines and set "
                            "reader.<split>.separator: '|')" if not separator else
                            f" (split on reader.<split>.separator {separator!r})")
                    raise ConfigError(f"{list_file}:{lineno}: expected 'image label' (2 fields), got "
                                      f"{len(parts)}: {line[:100]!r}{hint}")
                image = os.path.join(root, parts[0])
                self.items.append((image, os.path.join(root, parts[1]) if len(parts) == 2 else None))
        if not self.items:
            raise ConfigError(f"SegList list_file {list_file} has no entries")

    @classmethod
    def class_names(cls, num_classes=None, label_names=None, **kwargs):
        if isinstance(label_names, str):
            if not os.path.isfile(label_names):
                raise ConfigError(f"SegList.label_names file not found: {label_names}")
            with open(label_names, encoding="utf-8") as f:
                label_names = [ln.strip() for ln in f if ln.strip()]
        if label_names is not None:
            if num_classes is not None and num_classes != len(label_names):
                raise ConfigError(f"SegList: num_classes {num_classes} but {len(label_names)} label_names")
            return list(label_names)
        if not num_classes or num_classes < 1:
            raise ConfigError("SegList needs num_classes or label_names")
        return [f"class {i}" for i in range(num_classes)]
