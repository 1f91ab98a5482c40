"""YouTube-8M reader: TFRecord framing, damaged files, SequenceExample wire format, pkl parity,
transforms."""
import logging
import os
import pickle
import struct

import numpy as np
import paddle
import pytest

from data import demo_youtube8m
from engine.errors import ConfigError, SampleError
from engine.data import PadSequences, SampleDataset, SerialLoader, Skipped, WorkerLoader
from engine.registry import DATASETS, TRANSFORMS
from engine.training.samplers import EpochBatchSampler
from readers import tfrecord as tfr
from readers.youtube8m import PCARescale, SampleFrames, YouTube8M, dequantize


# ------------------------------------------------------------------------------------ helpers

def make_videos(seed, lengths, num_classes=10):
    rng = np.random.default_rng(seed)
    return [{"id": f"v{seed}_{i}",
             "labels": sorted(rng.choice(num_classes, 1 + i % 3, replace=False)),
             "rgb": rng.integers(0, 256, (n, 1024), dtype=np.uint8),
             "audio": rng.integers(0, 256, (n, 128), dtype=np.uint8)}
            for i, n in enumerate(lengths)]


def write_tf(path, videos):
    tfr.write_records(path, [tfr.encode_sequence_example(
        {"id": v["id"].encode(), "labels": np.asarray(v["labels"], np.int64)},
        {"rgb": [[r.tobytes()] for r in v["rgb"]], "audio": [[a.tobytes()] for a in v["audio"]]})
        for v in videos])
    return str(path)


def write_pkl(path, videos):
    with open(path, "wb") as f:
        pickle.dump([{"video": v["id"], "feature": v["rgb"], "audio": v["audio"],
                      "label": list(v["labels"]), "nframes": min(len(v["rgb"]), 300)}
                     for v in videos], f)
    return str(path)


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# ---------------------------------------------------------------------------------- framing

def test_masked_crc_and_framing(tmp_path):
    assert tfr.crc32c.crc32c(b"123456789") == 0xE3069283      # the CRC-32C check value
    crc = 0xE3069283
    assert tfr.masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2 ** 32
    records = [b"", b"a", os.urandom(1000), b"xyz" * 7]
    path = str(tmp_path / "r.tfrecord")
    tfr.write_records(path, records)
    raw = open(path, "rb").read()
    assert len(raw) == sum(16 + len(r) for r in records)
    length, lcrc = struct.unpack("<QI", raw[16:28])                # second record's header
    assert length == 1 and lcrc == tfr.masked_crc(struct.pack("<Q", 1))
    assert raw[28:29] == b"a" and struct.unpack("<I", raw[29:33])[0] == tfr.masked_crc(b"a")
    offsets = tfr.index_records(path)
    assert offsets == [0, 16, 33, 1049]
    got = [tfr.read_record(path, o) for o in offsets]
    assert got == records and all(type(g) is bytes for g in got)
    assert list(tfr.iter_records(path)) == records


def test_flipped_data_byte_names_file_and_offset(tmp_path):
    path = write_tf(tmp_path / "a.tfrecord", make_videos(0, [5, 6, 7]))
    offsets = tfr.index_records(path)
    flip(path, offsets[1] + 12 + 40)                     # inside record 1's payload
    assert tfr.index_records(path) == offsets            # headers are intact
    with pytest.raises(tfr.CorruptRecord, match=rf"a\.tfrecord.*offset {offsets[1]}.*data CRC"):
        tfr.read_record(path, offsets[1])
    with pytest.raises(tfr.CorruptRecord):
        list(tfr.iter_records(path))

    ds = YouTube8M(files=[path], num_classes=10)
    assert len(ds) == 3                                  # found at load time, not at indexing
    with pytest.raises(SampleError, match=rf"a\.tfrecord.*offset {offsets[1]}"):
        ds[1]
    ds = YouTube8M(files=[path], num_classes=10, skip_bad=True)
    assert isinstance(ds[1], Skipped)
    batch = PadSequences(["rgb", "audio"])([ds[i] for i in range(3)])
    assert batch["num_skipped"] == 1 and batch["skipped"] == [1] and batch["index"].tolist() == [0, 2]
    assert batch["rgb_len"].tolist() == [5, 7]


@pytest.mark.parametrize("damage", ["length_crc", "truncated"])
def test_framing_errors_found_while_indexing(tmp_path, damage):
    path = write_tf(tmp_path / "b.tfrecord", make_videos(1, [4, 5, 6, 7]))
    offsets = tfr.index_records(path)
    if damage == "length_crc":
        flip(path, offsets[2] + 3)                       # a byte of record 2's length field
        reason = "length CRC"
    else:
        os.truncate(path, offsets[2] + 100)              # record 2 cut short, record 3 gone
        reason = "truncated"
    with pytest.raises(tfr.CorruptRecord, match=rf"b\.tfrecord.*offset {offsets[2]}.*{reason}"):
        tfr.index_records(path)
    # changed with resynchronisation: after a bad length CRC the scan finds record 3 again
    readable = offsets[:2] + offsets[3:] if damage == "length_crc" else offsets[:2]
    assert tfr.scan_records(path)[0] == readable
    with pytest.raises(SampleError, match=rf"b\.tfrecord.*offset {offsets[2]}"):
        YouTube8M(files=[path], num_classes=10)

    ds = YouTube8M(files=[path], num_classes=10, skip_bad=True)
    assert len(ds) == len(readable) + 1                  # the good records + the bad spot
    assert isinstance(ds[2], Skipped) and ds.describe(2) == f"{path}@{offsets[2]}"
    batch = PadSequences(["rgb", "audio"])([ds[i] for i in range(len(ds))])
    assert batch["num_skipped"] == 1
    assert batch["rgb_len"].tolist() == ([4, 5, 7] if damage == "length_crc" else [4, 5])


# ---------------------------------------------------------------------------- damaged files

def test_vectorised_length_crc_matches_crc32c():
    values = np.random.default_rng(0).integers(0, 2 ** 63, 500, dtype=np.uint64)
    values[:4] = [0, 1, 255, 2 ** 64 - 1]
    assert tfr.masked_crc_u64(values).tolist() == \
        [tfr.masked_crc(int(v).to_bytes(8, "little")) for v in values]
    assert tfr._EMPTY_CRC == tfr.masked_crc(bytes(8))


def test_find_next_record_skips_zeros_and_garbage(tmp_path):
    good = tfr._frame(b"payload" * 10)
    length = struct.pack("<Q", 5)                       # a sound header, a body with a bad CRC
    fake = length + struct.pack("<I", tfr.masked_crc(length)) + b"12345" + bytes(4)
    garbage = np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    blob = bytes(5000) + garbage + fake + bytes(77) + good
    fake_at, good_at = 8000, 8000 + len(fake) + 77
    path = tmp_path / "g.bin"
    path.write_bytes(blob)
    with open(path, "rb") as f:
        for chunk in (64, 1000, 1 << 21):               # headers across block boundaries too
            assert tfr.find_next_record(f, 0, len(blob), chunk=chunk) == fake_at
            assert tfr.find_next_record(f, 0, len(blob), check_crc=True, chunk=chunk) == good_at
            assert tfr.find_next_record(f, fake_at + 1, len(blob), chunk=chunk) == good_at
            assert tfr.find_next_record(f, good_at + 1, len(blob), chunk=chunk) is None
    blob = bytes(300) + tfr._frame(b"")                 # an empty record after zeros
    path.write_bytes(blob)
    with open(path, "rb") as f:
        assert tfr.find_next_record(f, 1, len(blob), chunk=64) == 300


def _cut(path, fraction):
    """Truncate an intact file; returns (offsets, records kept, records lost) by its framing."""
    offsets = tfr.index_records(path)
    size = os.path.getsize(path)
    cut = int(size * fraction)
    ends = offsets[1:] + [size]
    kept = sum(e <= cut for e in ends)
    os.truncate(path, cut)
    return offsets, kept, len(offsets) - kept


def test_file_cut_in_half_reads_the_first_half_and_estimates_the_rest(tmp_path, caplog):
    lengths = np.random.default_rng(7).integers(6, 14, 40).tolist()
    paths = [write_tf(tmp_path / f"train{i}.tfrecord", make_videos(30 + i, lengths))
             for i in range(4)]
    offsets, kept, truth = _cut(paths[0], 0.5)
    assert 15 <= truth <= 25
    with caplog.at_level(logging.WARNING, logger="zoo"):
        ds = YouTube8M(files=paths, num_classes=10, skip_bad=True)
    assert len(ds) == 4 * 40 - truth + 1                 # the bad spot keeps one entry
    assert [ds.describe(i) for i in range(kept)] == [f"v30_{i}" for i in range(kept)]
    (d,) = ds.damage
    assert (d.path, d.offset, d.kind, d.exact) == (paths[0], offsets[kept], "truncated", False)
    assert abs(d.records_lost - truth) <= 0.2 * truth
    faults = ds.data_faults()
    assert faults == {"records_lost": d.records_lost, "summary":
                      f"1 damaged file: about {d.records_lost} records lost (train0.tfrecord from "
                      f"byte {offsets[kept]}: about {d.records_lost} records (file cut short))"}
    assert [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()] == \
        ["YouTube8M: " + faults["summary"]]                               # logged once
    with pytest.raises(SampleError, match=rf"offset {offsets[kept]}: truncated.*"
                                          rf"about {d.records_lost} records lost"):
        ds.load(kept)
    batch = PadSequences(["rgb", "audio"])([ds[i] for i in range(kept - 1, kept + 2)])
    assert batch["num_skipped"] == 1                    # a fault shows; the summary says how big

    # alone, the file does not say how long it was: only the record it ends in is certain
    alone = YouTube8M(files=[paths[0]], num_classes=10, skip_bad=True)
    assert alone.damage[0].lower_bound and alone.data_faults()["records_lost"] == 1
    assert alone.damage_summary().startswith("1 damaged file: at least 1 record lost (")
    with pytest.raises(tfr.CorruptRecord, match=rf"train0\.tfrecord.*offset {offsets[kept]}"):
        YouTube8M(files=paths, num_classes=10)


def test_overwritten_header_resyncs_and_loses_one_record(tmp_path):
    path = write_tf(tmp_path / "h.tfrecord", make_videos(40, [5] * 30))
    offsets = tfr.index_records(path)
    with open(path, "r+b") as f:
        f.seek(offsets[12])
        f.write(b"\xab" * 12)
    scan = tfr.scan_records(path)
    assert scan.offsets == offsets[:12] + offsets[13:]
    (d,) = scan.damage
    assert (d.offset, d.end, d.kind, d.records_lost, d.exact) == \
        (offsets[12], offsets[13], "bad_header", 1, True)
    ds = YouTube8M(files=[path], num_classes=10, skip_bad=True)
    assert len(ds) == 30 and isinstance(ds[12], Skipped)
    assert [ds.describe(i) for i in range(30) if i != 12] == \
        [f"v40_{i}" for i in range(30) if i != 12]
    assert ds.data_faults() == {"records_lost": 1, "summary": f"1 damaged file: 1 record lost "
                                f"(h.tfrecord from byte {offsets[12]}: 1 record (bad header))"}

    # zeros over the headers of records 12..14: the gap is three records, estimated
    with open(path, "r+b") as f:
        f.seek(offsets[12])
        f.write(bytes(offsets[14] + 100 - offsets[12]))
    ds = YouTube8M(files=[path], num_classes=10, skip_bad=True)
    (d,) = ds.damage
    assert (d.offset, d.end, d.records_lost, d.exact) == (offsets[12], offsets[15], 3, False)
    assert [ds.describe(i) for i in range(13, 28)] == [f"v40_{i}" for i in range(15, 30)]


def test_bad_data_crc_is_one_record_lost(tmp_path):
    path = write_tf(tmp_path / "c.tfrecord", make_videos(41, [5] * 6))
    offsets = tfr.index_records(path)
    flip(path, offsets[3] + 12 + 50)
    ds = YouTube8M(files=[path], num_classes=10, skip_bad=True)    # headers only: found on load
    assert ds.damage == [] and ds.data_faults() == {"records_lost": 0, "summary": ""}
    assert PadSequences(["rgb", "audio"])([ds[i] for i in range(6)])["num_skipped"] == 1

    checked = YouTube8M(files=[path], num_classes=10, skip_bad=True, check_crc=True)
    (d,) = checked.damage
    assert (d.offset, d.end, d.kind, d.records_lost, d.exact) == \
        (offsets[3], offsets[4], "data_crc", 1, True)
    assert len(checked) == 6 and isinstance(checked[3], Skipped) and not isinstance(checked[4], Skipped)
    assert checked.data_faults()["summary"] == (f"1 damaged file: 1 record lost (c.tfrecord from "
                                                f"byte {offsets[3]}: 1 record (bad data CRC))")
    with pytest.raises(tfr.CorruptRecord, match=rf"c\.tfrecord.*offset {offsets[3]}.*data CRC"):
        YouTube8M(files=[path], num_classes=10, check_crc=True)


def _damaged_shards(tmp_path):
    """Five TFRecord shards of 20 videos (a bad header, a bad data CRC, a cut at 60 %, two intact)
    and three pkl files of 3 videos (one unreadable); returns (paths, truth of the cut file)."""
    lengths = [8] * 20
    paths = [write_tf(tmp_path / f"s{i}.tfrecord", make_videos(50 + i, lengths)) for i in range(5)]
    offsets = tfr.index_records(paths[0])
    with open(paths[0], "r+b") as f:
        f.seek(offsets[5] + 2)
        f.write(b"\x77" * 8)
    flip(paths[1], tfr.index_records(paths[1])[7] + 12 + 9)
    _, _, truth = _cut(paths[2], 0.6)
    pkls = [write_pkl(tmp_path / f"p{i}.pkl", make_videos(60 + i, [4, 4, 4])) for i in range(3)]
    with open(pkls[0], "wb") as f:
        f.write(b"not a pickle")
    return paths + pkls, truth


def test_several_damaged_files_add_up(tmp_path):
    files, truth = _damaged_shards(tmp_path)
    ds = YouTube8M(files=files, num_classes=10, skip_bad=True, check_crc=True)
    lost = [(os.path.basename(d.path), d.kind, d.records_lost, d.exact) for d in ds.damage]
    cut = lost[2][2]
    assert lost == [("s0.tfrecord", "bad_header", 1, True), ("s1.tfrecord", "data_crc", 1, True),
                    ("s2.tfrecord", "truncated", cut, False), ("p0.pkl", "unreadable", 3, False)]
    assert abs(cut - truth) <= 0.2 * truth
    total = 1 + 1 + cut + 3
    faults = ds.data_faults()
    assert faults["records_lost"] == total
    assert faults["summary"].startswith(f"4 damaged files: about {total} records lost (s0.tfrecord")
    assert "p0.pkl from byte 0: about 3 records (unreadable file))" in faults["summary"]
    assert len(ds) == 5 * 20 - 2 - truth + 4 + 6        # records read + one entry per damage
    with pytest.raises(SampleError, match=r"p0\.pkl: cannot unpickle"):
        YouTube8M(files=files[5:], num_classes=10)
    assert SampleDataset().data_faults() == {"records_lost": 0, "summary": ""}


def test_damaged_files_with_two_workers(tmp_path):
    files, _ = _damaged_shards(tmp_path)
    ds = YouTube8M(files=files, num_classes=10, skip_bad=True, check_crc=True)
    faults = ds.data_faults()
    sampler = EpochBatchSampler(len(ds), 8, shuffle=True, seed=3)
    collate = PadSequences(["rgb", "audio"])

    def run(loader):
        return [(b["index"].numpy().tolist(), b["num_skipped"], b["skipped"]) for b in loader]

    serial = run(SerialLoader(ds, sampler, collate))
    assert sum(n for _, n, _ in serial) == 4           # each damaged range fails once
    assert run(WorkerLoader(ds, sampler, collate, num_workers=2)) == serial
    assert ds.data_faults() == faults

# --------------------------------------------------------------------------- wire format

def _ld(tag, payload):  # one length-delimited field, written out by hand (payloads < 128 bytes)
    return bytes([tag, len(payload)]) + payload


# Hand-assembled SequenceExample; tags are (field << 3) | wire type.
HAND_BUILT = b"".join([
    _ld(0x0A, b"".join([                                             # context (field 1)
        _ld(0x0A, _ld(0x0A, b"id") + _ld(0x12, _ld(0x0A, _ld(0x0A, b"ab")))),  # id: bytes_list
        _ld(0x0A, _ld(0x0A, b"labels") + _ld(0x12, _ld(0x1A,                     # int64_list
            _ld(0x0A, bytes([0x01, 0xAC, 0x02]))))),                             # packed [1, 300]
        _ld(0x0A, _ld(0x0A, b"neg") + _ld(0x12, _ld(0x1A,                        # unpacked
            bytes([0x08, 0x05]) + bytes([0x08]) + b"\xff" * 9 + b"\x01"))),      # [5, -1]
        _ld(0x0A, _ld(0x0A, b"f") + _ld(0x12, _ld(0x12,                          # float_list
            _ld(0x0A, struct.pack("<2f", 0.5, -1.0)) + b"\x0d" + struct.pack("<f", 3.0)))),
    ])),
    bytes([0x28, 0x07]),                                             # unknown field 5: skipped
    _ld(0x12, _ld(0x0A, _ld(0x0A, b"rgb") + _ld(0x12,                 # feature_lists (field 2)
        _ld(0x0A, _ld(0x0A, _ld(0x0A, b"\x01\x02\x03"))) +           # frame 0
        _ld(0x0A, _ld(0x0A, _ld(0x0A, b"\x04\x05\x06")))))),         # frame 1
])


def test_sequence_example_hand_built_bytes():
    context, lists = tfr.decode_sequence_example(HAND_BUILT)
    assert context["id"] == [b"ab"]
    assert context["labels"].tolist() == [1, 300] and context["labels"].dtype == np.int64
    assert context["neg"].tolist() == [5, -1]
    assert context["f"].tolist() == [0.5, -1.0, 3.0] and context["f"].dtype == np.float32
    assert lists == {"rgb": [[b"\x01\x02\x03"], [b"\x04\x05\x06"]]}
    assert tfr.decode_sequence_example(HAND_BUILT, feature_lists=[])[1] == {}
    with pytest.raises(tfr.DecodeError):
        tfr.decode_sequence_example(HAND_BUILT[:-3])


def test_sequence_example_round_trip():
    ctx = {"id": b"Xy9z", "labels": np.array([0, 3861, 2 ** 40, -7]),
           "w": np.array([0.25, -8.5], np.float32), "names": [b"a", b"", b"c"]}
    lists = {"rgb": [[bytes(range(i, i + 16))] for i in range(5)], "audio": [[b"\x00" * 4]],
             "empty": []}
    data = tfr.encode_sequence_example(ctx, lists)
    c2, l2 = tfr.decode_sequence_example(data)
    assert c2["id"] == [b"Xy9z"] and c2["names"] == [b"a", b"", b"c"]
    assert c2["labels"].tolist() == [0, 3861, 2 ** 40, -7] and c2["w"].tolist() == [0.25, -8.5]
    assert l2 == lists
    # our encoder writes what the hand-built bytes spell
    same = tfr.encode_sequence_example({"id": b"ab", "labels": [1, 300]},
                                       {"rgb": [[b"\x01\x02\x03"], [b"\x04\x05\x06"]]})
    c3, l3 = tfr.decode_sequence_example(same)
    assert sorted(c3) == ["id", "labels"] and c3["id"] == [b"ab"]
    assert c3["labels"].tolist() == [1, 300] and l3 == tfr.decode_sequence_example(HAND_BUILT)[1]
    assert same.startswith(bytes.fromhex("0a210a0c0a0269641206"))   # context, then the id entry


def _protobuf_sequence_example():
    """tf.train.SequenceExample built from descriptors at run time (no TensorFlow, no protoc)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="zoo_tf_example.proto", package="zootf",
                                             syntax="proto3")

    def message(name, fields, nested=(), oneof=None):
        m = fdp.message_type.add(name=name)
        for n in nested:
            m.nested_type.add().CopyFrom(n)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                f.type_name = ".zootf." + tname
            if oneof:
                f.oneof_index = 0

    def entry(name, value_type):
        e = descriptor_pb2.DescriptorProto(name=name)
        e.options.map_entry = True
        e.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        e.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".zootf." + value_type)
        return e

    R, O, M = F.LABEL_REPEATED, F.LABEL_OPTIONAL, F.TYPE_MESSAGE
    message("BytesList", [("value", 1, F.TYPE_BYTES, R, None)])
    message("FloatList", [("value", 1, F.TYPE_FLOAT, R, None)])
    message("Int64List", [("value", 1, F.TYPE_INT64, R, None)])
    message("Feature", [("bytes_list", 1, M, O, "BytesList"), ("float_list", 2, M, O, "FloatList"),
                        ("int64_list", 3, M, O, "Int64List")], oneof="kind")
    message("Features", [("feature", 1, M, R, "Features.FeatureEntry")],
            [entry("FeatureEntry", "Feature")])
    message("FeatureList", [("feature", 1, M, R, "Feature")])
    message("FeatureLists", [("feature_list", 1, M, R, "FeatureLists.FeatureListEntry")],
            [entry("FeatureListEntry", "FeatureList")])
    message("SequenceExample", [("context", 1, M, O, "Features"),
                                ("feature_lists", 2, M, O, "FeatureLists")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("zootf.SequenceExample"))


def test_sequence_example_matches_protobuf():
    SequenceExample = _protobuf_sequence_example()
    ex = SequenceExample()
    ex.ParseFromString(HAND_BUILT)
    assert list(ex.context.feature["labels"].int64_list.value) == [1, 300]
    assert list(ex.context.feature["neg"].int64_list.value) == [5, -1]
    assert list(ex.context.feature["f"].float_list.value) == [0.5, -1.0, 3.0]
    assert [list(f.bytes_list.value) for f in ex.feature_lists.feature_list["rgb"].feature] == \
        [[b"\x01\x02\x03"], [b"\x04\x05\x06"]]
    # protobuf's own serialization decodes to the same content, and ours parses in protobuf
    ctx, lists = tfr.decode_sequence_example(ex.SerializeToString())
    ref_ctx, ref_lists = tfr.decode_sequence_example(HAND_BUILT)
    assert lists == ref_lists and sorted(ctx) == sorted(ref_ctx)
    assert all(np.array_equal(ctx[k], ref_ctx[k]) for k in ("labels", "neg", "f"))
    ours = tfr.encode_sequence_example(
        {"id": b"zz", "labels": np.array([7, -2]), "w": np.array([1.5], np.float32)},
        {"audio": [[b"\x09" * 128], [b"\x0a" * 128]]})
    ex2 = SequenceExample()
    ex2.ParseFromString(ours)
    assert ex2.context.feature["id"].bytes_list.value == [b"zz"]
    assert list(ex2.context.feature["labels"].int64_list.value) == [7, -2]
    assert list(ex2.context.feature["w"].float_list.value) == [1.5]
    assert [f.bytes_list.value[0] for f in ex2.feature_lists.feature_list["audio"].feature] == \
        [b"\x09" * 128, b"\x0a" * 128]


# ------------------------------------------------------------------------------------- reader

def test_dequantize_formula():
    q = np.arange(256, dtype=np.uint8)
    x = dequantize(q)
    assert x.dtype == np.float32
    np.testing.assert_allclose(x, q * 4.0 / 255.0 + 4.0 / 512.0 - 2.0, atol=1e-6)
    assert x[0] == pytest.approx(-2 + 4 / 512) and x[255] == pytest.approx(2 + 4 / 512)
    assert np.all(np.diff(x) > 0)


def test_tfrecord_and_pkl_give_identical_samples(tmp_path):
    videos = make_videos(2, [3, 40, 301, 8, 1])
    tf_path = write_tf(tmp_path / "s.tfrecord", videos)
    pkl_path = write_pkl(tmp_path / "s.pkl", videos)
    a = YouTube8M(files=[tf_path], num_classes=10, max_frames=30)
    b = YouTube8M(files=[pkl_path], num_classes=10, max_frames=30)
    assert len(a) == len(b) == 5
    for i, v in enumerate(videos):
        sa, sb = a[i], b[i]
        assert sorted(k for k in sa if not k.startswith("_")) == ["audio", "index", "labels", "rgb"]
        n = min(len(v["rgb"]), 30)
        assert sa["rgb"].shape == (n, 1024) and sa["audio"].shape == (n, 128)
        assert sa["rgb"].dtype == np.float32
        np.testing.assert_array_equal(sa["rgb"], dequantize(v["rgb"][:n]))
        np.testing.assert_array_equal(sa["audio"], dequantize(v["audio"][:n]))
        for key in ("rgb", "audio", "labels"):
            np.testing.assert_array_equal(sa[key], sb[key])
        assert np.flatnonzero(sa["labels"]).tolist() == list(v["labels"])
        assert sa["labels"].shape == (10,) and sa["labels"].dtype == np.float32
        assert a.describe(i) == b.describe(i) == v["id"]
    # Paddle's pkl caps frames at 'nframes' = min(n, 300)
    assert YouTube8M(files=[pkl_path], num_classes=10)[2]["rgb"].shape == (300, 1024)
    assert YouTube8M(files=[tf_path], num_classes=10)[2]["rgb"].shape == (300, 1024)
    with open(pkl_path, "rb") as f:
        items = pickle.load(f)
    items[3]["nframes"] = 5                              # 'nframes' rules over the array length
    with open(pkl_path, "wb") as f:
        pickle.dump(items, f)
    assert YouTube8M(files=[pkl_path], num_classes=10)[3]["audio"].shape == (5, 128)
    only_rgb = YouTube8M(files=[pkl_path], num_classes=10, feature_names=["rgb"])[0]
    assert "audio" not in only_rgb and only_rgb["rgb"].shape == (3, 1024)


def test_bad_labels_and_missing_features(tmp_path):
    videos = make_videos(3, [4])
    path = write_tf(tmp_path / "l.tfrecord", videos)
    with pytest.raises(SampleError, match=r"l\.tfrecord.*outside \[0, 2\)"):
        YouTube8M(files=[path], num_classes=2)[0]
    with pytest.raises(SampleError, match="no feature list 'flow'"):
        YouTube8M(files=[path], num_classes=10, feature_names=["rgb", "flow"])[0]


def test_files_globs_lists_and_errors(tmp_path, monkeypatch):
    sub = tmp_path / "shards"
    sub.mkdir()
    for i in range(3):
        write_tf(sub / f"train{i:04d}.tfrecord", make_videos(10 + i, [2] * (i + 1)))
    write_pkl(sub / "extra.pkl", make_videos(20, [2, 2]))
    (tmp_path / "train.list").write_text("# shards\nshards/train0000.tfrecord\n\n"
                                         "shards/train0002.tfrecord\nshards/extra.pkl\n")
    monkeypatch.chdir(sub)                              # list entries resolve next to the list
    ds = YouTube8M(files=str(tmp_path / "train.list"), num_classes=10)
    assert len(ds) == 1 + 3 + 2 and ds.formats == ["tfrecord", "tfrecord", "pkl"]
    assert [ds.describe(i) for i in range(len(ds))] == \
        ["v10_0", "v12_0", "v12_1", "v12_2", "v20_0", "v20_1"]
    assert len(YouTube8M(files=[str(sub / "train*.tfrecord")], num_classes=10)) == 6
    assert len(YouTube8M(files=["train0001.tfrecord", "extra.pkl"], num_classes=10)) == 4

    with pytest.raises(ConfigError, match="nothing_here"):
        YouTube8M(files=[str(sub / "nothing_here*.tfrecord")])
    with pytest.raises(ConfigError, match="missing.tfrecord"):
        YouTube8M(files=["missing.tfrecord"])
    (tmp_path / "bad.list").write_text("shards/gone.tfrecord\n")
    with pytest.raises(ConfigError, match=r"gone\.tfrecord.*bad\.list"):
        YouTube8M(files=[str(tmp_path / "bad.list")])
    (sub / "x.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"x\.bin"):
        YouTube8M(files=["x.bin"])
    assert len(YouTube8M(files=["x.bin"], format="tfrecord")) == 0
    with pytest.raises(ConfigError, match="format"):
        YouTube8M(files=["x.bin"], format="hdf5")


def test_registered_and_built_from_config(tmp_path):
    path = write_tf(tmp_path / "c.tfrecord", make_videos(4, [6]))
    ds = DATASETS.build({"name": "YouTube8M", "files": [path], "num_classes": 10,
                         "transforms": [{"name": "SampleFrames", "num_frames": 4}]})
    assert ds[0]["rgb"].shape == (4, 1024) and ds[0]["audio"].shape == (4, 128)
    assert "PCARescale" in TRANSFORMS


# --------------------------------------------------------------------------------- transforms

def test_sample_frames_center_and_short_videos():
    t = SampleFrames(num_frames=4, mode="center")
    s = t({"rgb": np.arange(20)[:, None], "audio": np.arange(20)[:, None] * 10})
    assert s["rgb"].ravel().tolist() == [2, 7, 12, 17]           # centre of each stride of 5
    assert s["audio"].ravel().tolist() == [20, 70, 120, 170]
    s = t({"rgb": np.arange(3)[:, None]})                       # shorter: frames repeat
    assert s["rgb"].ravel().tolist() == [0, 1, 1, 2]
    assert t({"rgb": np.arange(1)[:, None]})["rgb"].ravel().tolist() == [0, 0, 0, 0]
    with pytest.raises(ConfigError):
        SampleFrames(num_frames=4, mode="uniform")


def test_sample_frames_random_depends_on_seed_epoch_index(tmp_path):
    path = write_tf(tmp_path / "r.tfrecord", make_videos(5, [50, 50]))

    def frames(seed=0, epoch=0, index=0):
        ds = YouTube8M(files=[path], num_classes=10, seed=seed,
                       transforms=[SampleFrames(num_frames=10, mode="random")])
        ds.set_epoch(epoch)
        rgb = ds[index]["rgb"]
        full = dequantize(make_videos(5, [50, 50])[index]["rgb"])
        return [int(np.flatnonzero((full == row).all(1))[0]) for row in rgb]

    a = frames()
    assert a == frames()                                        # a new dataset, same draw
    assert all(5 * i <= f < 5 * (i + 1) for i, f in enumerate(a))   # one frame per stride
    assert frames(epoch=1) != a and frames(seed=1) != a
    assert frames(index=1) != a


def test_pca_rescale(tmp_path):
    eig = np.linspace(4.0, 0.01, 1100).astype(np.float32)[:, None]     # [N, 1] like eigenvals.npy
    np.save(tmp_path / "eigenvals.npy", eig)
    t = PCARescale(eigenvalues_file=str(tmp_path / "eigenvals.npy"))
    x = np.random.default_rng(0).uniform(-2, 2, (7, 1024)).astype(np.float32)
    out = t({"rgb": x.copy(), "audio": x[:, :128].copy()})
    np.testing.assert_allclose(out["rgb"], (x - 4 / 512) * (np.sqrt(eig[:1024, 0]) + 1e-4),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["audio"], x[:, :128])
    with pytest.raises(ConfigError, match="nope.npy"):
        PCARescale(eigenvalues_file=str(tmp_path / "nope.npy"))
    with pytest.raises(ConfigError):
        PCARescale()


# ------------------------------------------------------------------------------------ loader

def test_dataloader_two_workers_pad_sequences(tmp_path):
    lengths = [3, 9, 1, 12, 5, 7, 2]
    videos = make_videos(6, lengths)
    write_tf(tmp_path / "d0.tfrecord", videos[:4])
    write_tf(tmp_path / "d1.tfrecord", videos[4:])
    ds = YouTube8M(files=[str(tmp_path / "d*.tfrecord")], num_classes=10)
    loader = paddle.io.DataLoader(ds, batch_size=3, shuffle=False, num_workers=2,
                                  collate_fn=PadSequences(["rgb", "audio"]))
    seen = []
    for batch in loader:
        idx = batch["index"].numpy().tolist()
        lens = np.array([lengths[i] for i in idx])
        T = lens.max()
        assert batch["rgb"].shape == [len(idx), T, 1024]
        assert batch["audio"].shape == [len(idx), T, 128]
        assert batch["rgb_len"].numpy().tolist() == lens.tolist()
        mask = batch["rgb_mask"].numpy()
        expected = (np.arange(T)[None] < lens[:, None]).astype(np.float32)
        np.testing.assert_array_equal(mask, expected)
        np.testing.assert_array_equal(batch["audio_mask"].numpy(), mask)
        rgb = batch["rgb"].numpy()
        for row, i in enumerate(idx):
            np.testing.assert_array_equal(rgb[row, :lengths[i]], dequantize(videos[i]["rgb"]))
            assert not rgb[row, lengths[i]:].any()                 # zero padding
        assert batch["labels"].shape == [len(idx), 10]
        seen += idx
    assert seen == list(range(7))


def test_demo_generator_small(tmp_path):
    root = str(tmp_path / "demo")
    demo_youtube8m.make(root, num_train=24, num_val=8, num_classes=5, train_shards=3,
                        val_shards=2)
    stamp = os.path.getmtime(os.path.join(root, "tfrecord", "train0000.tfrecord"))
    demo_youtube8m.make(root, num_train=24, num_val=8, num_classes=5, train_shards=3,
                        val_shards=2)                                   # idempotent
    assert os.path.getmtime(os.path.join(root, "tfrecord", "train0000.tfrecord")) == stamp
    assert len(open(os.path.join(root, "label_names.txt")).read().split("\n")) == 6
    tf_train = YouTube8M(files=[os.path.join(root, "train.list")], num_classes=5)
    pk_train = YouTube8M(files=[os.path.join(root, "train_pkl.list")], num_classes=5)
    val = YouTube8M(files=[os.path.join(root, "val.list")], num_classes=5)
    assert len(tf_train) == len(pk_train) == 24 and len(val) == 8
    for i in range(0, 24, 5):
        a, b = tf_train[i], pk_train[i]
        np.testing.assert_array_equal(a["rgb"], b["rgb"])
        assert 10 <= len(a["rgb"]) <= 150 and 1 <= a["labels"].sum() <= 3
    ids = {tf_train.describe(i) for i in range(24)} | {val.describe(i) for i in range(8)}
    assert len(ids) == 32
    eig = np.load(os.path.join(root, "yt8m_pca", "eigenvals.npy"))
    assert eig.shape == (1024, 1) and (eig > 0).all()
