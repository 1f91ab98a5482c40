"""Pascal VOC 2012 + SBD ("trainaug"): convert SBD's class labels (.mat) to PNG and write the image list.

    python data/prepare_voc_sbd.py --voc data/VOCdevkit --sbd data/benchmark_RELEASE

Inputs: VOC 2012 (VOCtrainval_11-May-2012.tar -> VOCdevkit/VOC2012/) and SBD (benchmark.tgz from the
Semantic Boundaries Dataset -> benchmark_RELEASE/dataset/{cls/*.mat, train.txt, val.txt}).
Writes, as PaddleSeg's tools/data/voc_augment.py does (PaddleSeg's PascalVOC `trainaug` reads them):
- VOC2012/SegmentationClassAug/<id>.png for every SBD image: `GTcls.Segmentation` (class ids 0..20)
  as a palette PNG with VOC's colours (SBD has no void boundary: no 255);
- VOC2012/ImageSets/Segmentation/aug.txt: the SBD images (its train and val) that are not in VOC's
  trainval, sorted. With VOC's train.txt (1464) they make the 10582 trainaug images; VOC val (1449)
  stays out. The images themselves are all in VOC2012/JPEGImages.

SBD's .mat files are MATLAB 5 files; `read_mat` below reads what they hold (structs, cells, numeric
arrays, compressed or not) without scipy.
"""
import argparse
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from outputs.palettes import voc_palette  # noqa: E402

# MAT-file level 5 data types (MATLAB "MAT-File Format", Table 1-1) and array classes (Table 1-3)
_DTYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8",
           16: "u1", 17: "u2", 18: "u4"}
_MATRIX, _COMPRESSED = 14, 15
_CLASSES = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4", 13: "u4", 14: "i8", 15: "u8"}
_CELL, _STRUCT, _CHAR = 1, 2, 4


class MatError(ValueError):
    pass


def _elements(buf, order):
    """Yield (type, payload) of the data elements in `buf`; small elements pack 4 bytes in the tag."""
    pos = 0
    while pos + 8 <= len(buf):
        first, nbytes = struct.unpack_from(order + "II", buf, pos)
        if first >> 16:                         # small data element: [nbytes:16 | type:16] + 4 data bytes
            yield first & 0xFFFF, buf[pos + 4:pos + 4 + (first >> 16)]
            pos += 8
            continue
        start, pos = pos + 8, pos + 8 + nbytes
        if pos > len(buf):
            raise MatError(f"element of {nbytes} bytes runs past the end of the data")
        yield first, buf[start:pos]
        if first != _COMPRESSED:
            pos += (-nbytes) % 8                # elements are padded to 8 bytes
    return


def _numeric(typ, payload, order):
    if typ not in _DTYPES:
        raise MatError(f"unsupported data type {typ}")
    return np.frombuffer(payload, dtype=np.dtype(_DTYPES[typ]).newbyteorder(order))


def _matrix(payload, order):
    """One miMATRIX: a numeric ndarray, a str, a list (cell), a dict or list of dicts (struct), or
    None for what SBD's labels do not need (sparse, objects)."""
    if not payload:
        return np.zeros((0, 0))
    parts = iter(_elements(payload, order))
    _, flags = next(parts)
    cls = struct.unpack_from(order + "I", flags)[0] & 0xFF
    dims = tuple(int(d) for d in _numeric(*next(parts), order))
    next(parts)                                 # array name (empty inside structs and cells)
    count = int(np.prod(dims))
    if cls in _CLASSES:
        real = _numeric(*next(parts), order).astype(_CLASSES[cls])
        return real.reshape(dims, order="F")
    if cls == _CHAR:
        typ, data = next(parts)
        return "".join(map(chr, _numeric(typ, data, order)))
    if cls == _CELL:
        cells = [_matrix(data, order) for _, data in (next(parts) for _ in range(count))]
        return cells
    if cls == _STRUCT:
        length = int(_numeric(*next(parts), order)[0])
        raw = bytes(next(parts)[1])
        names = [raw[i:i + length].split(b"\0")[0].decode() for i in range(0, len(raw), length)]
        items = [{n: _matrix(next(parts)[1], order) for n in names} for _ in range(count)]
        return items[0] if count == 1 else items
    return None


def read_mat(path):
    """{variable name: value} of a MATLAB 5 .mat file (compressed or not)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 128 or not data.startswith(b"MATLAB 5.0 MAT-file"):
        raise MatError(f"{path} is not a MATLAB 5 .mat file (version 7.3 files are HDF5: not supported)")
    order = {b"IM": "<", b"MI": ">"}.get(data[126:128])
    if order is None:
        raise MatError(f"{path}: bad endian indicator {data[126:128]!r}")
    out = {}
    for typ, payload in _elements(memoryview(data)[128:], order):
        if typ == _COMPRESSED:
            payload = zlib.decompress(payload)
            (typ, payload), = _elements(payload, order)
        if typ != _MATRIX:
            continue
        parts = iter(_elements(payload, order))
        next(parts), next(parts)
        name = bytes(next(parts)[1]).decode()
        out[name] = _matrix(payload, order)
    return out


def sbd_segmentation(path):
    """The class-id map (uint8 [H, W]) of one SBD `cls/*.mat` file."""
    try:
        seg = read_mat(path)["GTcls"]["Segmentation"]
    except (KeyError, TypeError, StopIteration, struct.error, zlib.error) as e:
        raise MatError(f"{path}: no GTcls.Segmentation ({type(e).__name__}: {e})") from None
    seg = np.asarray(seg)
    if seg.ndim != 2 or seg.size == 0 or seg.min() < 0 or seg.max() > 255:
        raise MatError(f"{path}: GTcls.Segmentation is not a class-id map (shape {seg.shape})")
    return seg.astype(np.uint8)


def _ids(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"list not found: {path}")
    with open(path) as f:
        return [ln.strip() for ln in f if ln.strip()]


def prepare(voc_root, sbd_root, log=print):
    """Write SegmentationClassAug/*.png and aug.txt; returns (PNGs written, ids in aug.txt)."""
    voc = os.path.join(voc_root, "VOC2012")
    sets = os.path.join(voc, "ImageSets", "Segmentation")
    dataset = os.path.join(sbd_root, "dataset")
    sbd_ids = sorted(set(_ids(os.path.join(dataset, "train.txt")) + _ids(os.path.join(dataset, "val.txt"))))
    voc_trainval = set(_ids(os.path.join(sets, "trainval.txt")))
    out_dir = os.path.join(voc, "SegmentationClassAug")
    os.makedirs(out_dir, exist_ok=True)
    palette = voc_palette().reshape(-1).tolist()
    for n, i in enumerate(sbd_ids, 1):
        seg = sbd_segmentation(os.path.join(dataset, "cls", i + ".mat"))
        png = Image.fromarray(seg, mode="P")
        png.putpalette(palette)
        tmp = os.path.join(out_dir, i + ".png.tmp")
        png.save(tmp, format="PNG")
        os.replace(tmp, os.path.join(out_dir, i + ".png"))
        if n % 1000 == 0:
            log(f"{n}/{len(sbd_ids)} labels converted")
    aug = [i for i in sbd_ids if i not in voc_trainval]
    with open(os.path.join(sets, "aug.txt.tmp"), "w") as f:
        f.write("".join(i + "\n" for i in aug))
    os.replace(os.path.join(sets, "aug.txt.tmp"), os.path.join(sets, "aug.txt"))
    return len(sbd_ids), aug


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--voc", required=True, help="the VOCdevkit folder (holding VOC2012/)")
    p.add_argument("--sbd", required=True, help="the benchmark_RELEASE folder (holding dataset/cls/)")
    args = p.parse_args(argv)
    try:
        written, aug = prepare(args.voc, args.sbd)
    except (OSError, MatError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {written} labels to {os.path.join(args.voc, 'VOC2012', 'SegmentationClassAug')} and "
          f"{len(aug)} ids to aug.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
