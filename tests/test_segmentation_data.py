"""Segmentation data and metric: mIoU by hand, readers (Cityscapes ids, VOC palettes, lists, bad
files), the training transforms, the SBD conversion, the label-map writer. Expected values come from
hand arithmetic, the cityscapesscripts table and files written by other tools (PIL, cv2, scipy)."""
import os
import shutil

import cv2
import numpy as np
import pytest
from PIL import Image

from data.prepare_voc_sbd import main
from engine import builder
from engine.components import load_all
from engine.errors import ConfigError, SampleError
from engine.registry import OUTPUTS
from metrics.segmentation import MeanIoU, confusion_matrix, iou_scores
from outputs.palettes import voc_palette
from readers.fields import declare
from readers.image_transforms import PhotometricDistortion, RandomPaddingCrop, ResizeStepScaling
from readers.segmentation import VOC_CLASSES, Cityscapes, PascalVOC, SegList, read_label

load_all()
DATA = os.path.join(os.path.dirname(__file__), "data")

# ------------------------------------------------------------------------------- metric
LABEL = np.array([[0, 0, 1, 255],
                  [0, 1, 1, 255],
                  [2, 2, 255, 0]])
PRED = np.array([[0, 1, 1, 1],
                 [0, 1, 0, 2],
                 [2, 0, 2, 0]])
# the 9 counted pixels, rows = label, columns = prediction (the 3 ignored ones predict 1, 2, 2)
CM = np.array([[3, 1, 0, 0],
               [1, 2, 0, 0],
               [1, 0, 1, 0],
               [0, 0, 0, 0]])


def test_confusion_matrix_and_miou_by_hand():
    np.testing.assert_array_equal(confusion_matrix(PRED, LABEL, 4, 255), CM)
    iou, miou, acc = iou_scores(CM)
    # IoU0 = 3 / (4 + 5 - 3), IoU1 = 2 / (3 + 3 - 2), IoU2 = 1 / (2 + 1 - 1); class 3 is in neither
    # the labels nor the predictions: PaddleSeg counts it as IoU 1 (union 0), inside the mean
    np.testing.assert_allclose(iou, [0.5, 0.5, 0.5, 1.0])
    assert miou == pytest.approx(0.625)
    assert acc == pytest.approx(6 / 9)


class _DS:
    num_classes = 4
    ignore_index = 255
    label_names = ["Road", "traffic light", "sky", "x-ray"]


def test_mean_iou_metric_over_samples_names_and_baseline():
    m = MeanIoU(background_baseline=True)
    m.set_dataset(_DS())
    assert m.names() == ["miou", "pixel_acc", "iou_road", "iou_traffic_light", "iou_sky", "iou_x_ray",
                         "miou_all_background", "num_samples"]
    m.reset()
    m.update({"label_map": PRED[None, :2]}, {"index": np.array([0]), "label": LABEL[None, :2]})
    m.update({"label_map": PRED[None, 2:]}, {"index": np.array([1]), "label": LABEL[None, 2:]})
    m.update({"label_map": PRED[None, 2:]}, {"index": np.array([1]), "label": LABEL[None, 2:]})  # a repeat
    out = m.accumulate()
    assert out["miou"] == pytest.approx(0.625) and out["pixel_acc"] == pytest.approx(6 / 9)
    assert out["iou_traffic_light"] == pytest.approx(0.5) and out["iou_x_ray"] == 1.0
    # all background: IoU0 = 4 / 9 (label 0 has 4 of the 9 pixels), classes 1, 2: 0, class 3: 1
    assert out["miou_all_background"] == pytest.approx((4 / 9 + 1) / 4)
    assert out["num_samples"] == 2
    np.testing.assert_array_equal(m.confusion(), CM)


def test_metric_refuses_a_mismatched_dataset():
    with pytest.raises(ConfigError, match="num_classes 3"):
        MeanIoU(num_classes=3).set_dataset(_DS())


# ------------------------------------------------------------------------------- readers
def _png(path, array, palette=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    im = Image.fromarray(np.asarray(array, np.uint8), mode="P" if palette else "L")
    if palette:
        im.putpalette(voc_palette().reshape(-1).tolist())
    im.save(path)


def _jpg(path, h, w, value=120):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cv2.imwrite(path, np.full((h, w, 3), value, np.uint8))


def test_cityscapes_label_ids_map_to_train_ids(tmp_path):
    root = str(tmp_path)
    ids = np.array([[0, 7, 8, 11, 12], [13, 17, 19, 20, 21], [22, 23, 24, 25, 26], [27, 28, 31, 32, 33]])
    # cityscapesscripts labels.py: road 7 -> 0, ..., bicycle 33 -> 18; unlabeled 0 -> ignored
    train = np.array([[255, 0, 1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12, 13], [14, 15, 16, 17, 18]])
    for city, stem in (("aachen", "a_000000_000019"), ("bonn", "b_000000_000001"), ("koeln", "k_000000_000002")):
        os.makedirs(f"{root}/leftImg8bit/val/{city}")
        cv2.imwrite(f"{root}/leftImg8bit/val/{city}/{stem}_leftImg8bit.png", np.zeros((4, 5, 3), np.uint8))
    _png(f"{root}/gtFine/val/aachen/a_000000_000019_gtFine_labelIds.png", ids)
    other = np.array([[9, 10, 14, 15, 16], [18, 29, 30, 1, 2], [3, 4, 5, 6, 7], [7, 7, 7, 7, 7]])   # all void but 7
    _png(f"{root}/gtFine/val/bonn/b_000000_000001_gtFine_labelIds.png", other)
    _png(f"{root}/gtFine/val/bonn/b_000000_000001_gtFine_labelTrainIds.png", np.full((4, 5), 13))
    _png(f"{root}/gtFine/val/koeln/k_000000_000002_gtFine_labelIds.png", np.full((4, 5), 40))  # not an id

    ds = Cityscapes(root=root, mode="val")
    assert len(ds) == 3 and ds.num_classes == 19 and ds.label_names[6] == "traffic light"
    np.testing.assert_array_equal(ds[0]["label"], train)
    np.testing.assert_array_equal(ds[1]["label"], np.full((4, 5), 13))           # labelTrainIds as they are
    forced = Cityscapes(root=root, mode="val", label_type="labelIds")
    expect = np.full((4, 5), 255)
    expect[2, 4] = 0
    expect[3] = 0
    np.testing.assert_array_equal(forced[1]["label"], expect)
    with pytest.raises(SampleError, match="40.*not label ids"):
        ds[2]
    with pytest.raises(ConfigError, match="leftImg8bit/train"):
        Cityscapes(root=root, mode="train")


def test_palette_png_gives_class_ids_not_colours(tmp_path):
    ids = np.array([[0, 1, 1], [2, 15, 255]], np.uint8)
    path = str(tmp_path / "x.png")
    _png(path, ids, palette=True)
    np.testing.assert_array_equal(read_label(path), ids)
    colours = cv2.imread(path, cv2.IMREAD_UNCHANGED)     # what cv2 gives: the palette's colours
    assert colours.shape == (2, 3, 3) and colours[0, 1].tolist() == [0, 0, 128]   # BGR of VOC class 1
    rgb = str(tmp_path / "rgb.png")
    cv2.imwrite(rgb, colours)
    with pytest.raises(SampleError, match="RGB colour image"):
        read_label(rgb)


def _voc(root, ids, label_dir="SegmentationClass", values=None):
    voc = os.path.join(root, "VOC2012")
    for i in ids:
        _jpg(os.path.join(voc, "JPEGImages", i + ".jpg"), 6, 8)
        _png(os.path.join(voc, label_dir, i + ".png"), np.full((6, 8), values or 0), palette=True)
    return voc


def _write_list(path, ids):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(i + "\n" for i in ids))


def test_pascal_voc_modes(tmp_path):
    root = str(tmp_path)
    voc = _voc(root, ["a", "b"], values=15)
    _voc(root, ["c"], "SegmentationClassAug", values=3)
    sets = os.path.join(voc, "ImageSets", "Segmentation")
    _write_list(os.path.join(sets, "train.txt"), ["a", "b"])
    ds = PascalVOC(root=root, mode="train")
    assert len(ds) == 2 and ds.num_classes == 21 and ds.label_names == VOC_CLASSES
    assert ds[1]["label"].dtype == np.uint8 and (ds[1]["label"] == 15).all()   # 21 classes, 255: uint8
    with pytest.raises(ConfigError, match="prepare_voc_sbd"):
        PascalVOC(root=root, mode="trainaug")
    _write_list(os.path.join(sets, "aug.txt"), ["c"])
    aug = PascalVOC(root=root, mode="trainaug")
    assert [os.path.basename(p) for _, p in aug.items] == ["a.png", "b.png", "c.png"]
    assert (aug[2]["label"] == 3).all()
    with pytest.raises(SampleError, match="outside the classes 0..4"):
        PascalVOC(root=root, mode="train", label_names=["bg", "a", "b", "c", "d"])[0]
    ds = PascalVOC.for_inputs([os.path.join(voc, "JPEGImages")], root=root, mode="val")
    assert len(ds) == 3 and ds.label_names == VOC_CLASSES and set(ds[0]) == {"image", "index", "_rng", "_fields"}


def _bad_list(tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    _jpg(str(root / "ok.jpg"), 6, 8)
    _png(str(root / "ok.png"), np.eye(6, 8) * 4)
    _jpg(str(root / "nolabel.jpg"), 6, 8)
    _jpg(str(root / "size.jpg"), 6, 8)
    _png(str(root / "size.png"), np.zeros((6, 9)))
    _jpg(str(root / "values.jpg"), 6, 8)
    _png(str(root / "values.png"), np.full((6, 8), 7))
    (root / "corrupt.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    _png(str(root / "corrupt.png"), np.zeros((6, 8)))
    lines = ["ok.jpg ok.png", "nolabel.jpg nolabel.png", "size.jpg size.png", "values.jpg values.png",
             "corrupt.jpg corrupt.png"]
    (root / "list.txt").write_text("\n".join(lines) + "\n")
    return str(root / "list.txt")


def test_bad_samples_name_their_file(tmp_path):
    ds = SegList(_bad_list(tmp_path), num_classes=5)
    assert ds[0]["label"].max() == 4
    expected = [("label PNG not found for image .*nolabel.jpg", 1),
                (r"size.png is 6x9 but its image .*size.jpg is 6x8", 2),
                (r"values.png has values 7 outside the classes 0..4 and not the ignore index 255", 3),
                ("cannot decode image .*corrupt.jpg", 4)]
    for pattern, i in expected:
        with pytest.raises(SampleError, match=pattern):
            ds[i]


def test_a_list_with_spaces_in_file_names_names_the_separator_option(tmp_path):
    """The one line says which option reads such a list, and with it the list reads."""
    _png(str(tmp_path / "a b.png"), np.zeros((6, 8)))
    cv2.imwrite(str(tmp_path / "a b.jpg"), np.zeros((6, 8, 3), np.uint8))
    lst = tmp_path / "train.list"
    lst.write_text("a b.jpg a b.png\n")
    with pytest.raises(ConfigError) as e:
        SegList(str(lst), num_classes=2)
    assert str(e.value) == (f"{lst}:1: expected 'image label' (2 fields), got 4: 'a b.jpg a b.png' (file names "
                            f"with spaces? write 'image|label' lines and set reader.<split>.separator: '|')")
    lst.write_text("a b.jpg|a b.png\n")
    ds = SegList(str(lst), num_classes=2, separator="|")
    assert ds.items == [(str(tmp_path / "a b.jpg"), str(tmp_path / "a b.png"))]
    assert ds[0]["label"].shape == (6, 8)
    lst.write_text("a b.jpg|a b.png|c.png\n")
    with pytest.raises(ConfigError, match=r"got 3: .* \(split on reader.<split>.separator '\|'\)$"):
        SegList(str(lst), num_classes=2, separator="|")


def test_bad_samples_are_skipped_and_counted(tmp_path):
    cfg = {"reader": {"train": {"name": "SegList", "list_file": _bad_list(tmp_path), "num_classes": 5,
                                "skip_bad": True, "batch_size": 8, "transforms": [{"name": "Normalize"}],
                                "collate": {"name": "PadImages", "keys": {"image": 0, "label": 255}}}}}
    loader, _, _ = builder.build_loader(cfg, "train", 0)
    (batch,) = list(loader)
    assert batch["num_skipped"] == 4 and batch["index"].tolist() == [0]
    assert sorted(batch["skipped"]) == [1, 2, 3, 4]


# ------------------------------------------------------------------------------- transforms
def _sample(img, label, seed=0):
    s = declare({"image": img, "label": label}, image="image", label="label")
    s["_rng"] = np.random.default_rng(seed)
    return s


def test_padding_crop_pads_labels_with_the_ignore_index():
    img = np.full((20, 30, 3), 200, np.uint8)
    s = RandomPaddingCrop(crop_size=[40, 32])(_sample(img, np.ones((20, 30), np.int32)))   # [w, h]
    assert s["image"].shape == (32, 40, 3) and s["label"].shape == (32, 40)
    assert (s["label"][:20, :30] == 1).all() and (s["label"][20:] == 255).all() and (s["label"][:, 30:] == 255).all()
    assert (s["image"][:20, :30] == 200).all() and (s["image"][20:] == 127).all() and (s["image"][:, 30:] == 127).all()
    # taller than the window, narrower: padded on the right only, then a random row offset
    rows = np.repeat(np.arange(50, dtype=np.int32)[:, None] % 7, 30, axis=1)
    for seed in range(5):
        s = RandomPaddingCrop(crop_size=[40, 32])(_sample(np.zeros((50, 30, 3), np.uint8), rows, seed))
        y0 = [y for y in range(19) if (rows[y:y + 32] == s["label"][:, :30]).all()]
        assert y0 and (s["label"][:, 30:] == 255).all()


def test_resize_step_scaling():
    t = ResizeStepScaling(0.5, 2.0, 0.25)
    np.testing.assert_allclose(t.factors, [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0])   # PaddleSeg's 7 steps
    label = (np.arange(40 * 30).reshape(40, 30) % 5).astype(np.int32)
    sizes = set()
    for seed in range(12):
        s = t(_sample(np.zeros((40, 30, 3), np.uint8), label, seed))
        h, w = s["label"].shape
        assert s["image"].shape[:2] == (h, w) and h / 40 in t.factors and w == round(30 * h / 40)
        assert set(np.unique(s["label"])) <= set(range(5))        # nearest: no new values
        sizes.add(h)
    assert len(sizes) >= 3


def test_photometric_distortion_changes_the_image_only():
    rng = np.random.default_rng(1)
    img = rng.integers(50, 150, (16, 20, 3)).astype(np.uint8)
    label = rng.integers(0, 3, (16, 20)).astype(np.int32)
    off = PhotometricDistortion(brightness_prob=0, contrast_prob=0, saturation_prob=0, hue_prob=0)
    np.testing.assert_array_equal(off(_sample(img.copy(), label))["image"], img)
    bright = PhotometricDistortion(brightness_range=0.4, brightness_prob=1.0, contrast_prob=0,
                                   saturation_prob=0, hue_prob=0)
    s = bright(_sample(img.copy(), label.copy(), seed=3))
    np.testing.assert_array_equal(s["label"], label)
    delta = s["image"].mean() / img.mean()               # PIL Brightness: every pixel times one factor
    assert 0.6 <= delta <= 1.4 and abs(delta - 1) > 1e-3
    assert np.abs(s["image"].astype(float) - img * delta).max() <= 1.0
    again = bright(_sample(img.copy(), label.copy(), seed=3))
    np.testing.assert_array_equal(again["image"], s["image"])
    full = PhotometricDistortion(hue_prob=1.0, saturation_prob=1.0)(_sample(img.copy(), label.copy(), seed=4))
    assert full["image"].dtype == np.uint8 and full["image"].shape == img.shape


# ------------------------------------------------------------------------------- SBD conversion
def test_prepare_voc_sbd(tmp_path):
    voc, sbd = tmp_path / "VOCdevkit", tmp_path / "benchmark_RELEASE"
    _write_list(str(voc / "VOC2012" / "ImageSets" / "Segmentation" / "trainval.txt"), ["2008_000003"])
    (sbd / "dataset" / "cls").mkdir(parents=True)
    for i in ("2008_000002", "2008_000003"):
        shutil.copy(os.path.join(DATA, "sbd_cls", i + ".mat"), sbd / "dataset" / "cls")
    _write_list(str(sbd / "dataset" / "train.txt"), ["2008_000002"])
    _write_list(str(sbd / "dataset" / "val.txt"), ["2008_000003"])
    assert main(["--voc", str(voc), "--sbd", str(sbd)]) == 0
    expect2 = np.zeros((12, 17), np.uint8)
    expect2[2:7, 3:9] = 15
    expect2[6:11, 10:16] = 12
    expect3 = np.full((9, 7), 3, np.uint8)
    expect3[:4] = 0
    out = voc / "VOC2012" / "SegmentationClassAug"
    for i, expect in (("2008_000002", expect2), ("2008_000003", expect3)):
        png = Image.open(out / (i + ".png"))
        assert png.mode == "P"
        np.testing.assert_array_equal(np.asarray(png), expect)
    # SBD's images outside VOC trainval
    assert (voc / "VOC2012" / "ImageSets" / "Segmentation" / "aug.txt").read_text() == "2008_000002\n"


# ------------------------------------------------------------------------------- writer
def test_label_map_writer_cuts_padding(tmp_path):
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((3, 4, 3), np.uint8))
    w = OUTPUTS.build({"name": "LabelMap"})

    class Named:
        label_names = ["bg", "x"]
    w.open(str(tmp_path / "out"), Named())
    padded = np.full((1, 5, 6), 1, np.int32)
    padded[0, :3, :4] = 0
    w.write({"label_map": padded}, {"index": np.array([0]), "id": [str(tmp_path / "a.png")],
                                    "image_size": np.array([[3, 4]])})
    assert np.asarray(Image.open(tmp_path / "out" / "a.png")).tolist() == [[0] * 4] * 3
