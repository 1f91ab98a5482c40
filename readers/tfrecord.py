"""TFRecord files and `tf.train.SequenceExample` messages without TensorFlow.

Framing of one record (little-endian), as written by TensorFlow's RecordWriter:

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)
    masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (mod 2**32)

Random access needs the byte offset of each record: `scan_records` walks the headers only (it checks
the length CRC, because a bad length would send the walk into garbage) and `read_record` checks the
data CRC when the record is read. Compressed (GZIP/ZLIB) TFRecords are not supported.

Damaged files. After a bad length CRC the walk resynchronises: it searches forward, byte by byte
(vectorised), for the next header with a valid length CRC whose record fits in the file, and goes
on from there, so a damaged region loses only the records inside it. A file that ends inside a
header or a record (cut short) loses its tail. Each unreadable range is a `Damage` with the
records it cost: exact when known (one bad data CRC; a gap that is exactly one record whose body
still matches its data CRC), otherwise estimated from the bytes lost and the mean record size.
How long a cut file was is not in the file: the caller may pass the size it should have
(`estimate_losses(expected_size=...)`), else only the record it ends in counts, as a lower bound.

Protobuf wire format of the messages we decode (field numbers from tensorflow/core/example/*.proto):

    SequenceExample { Features context = 1;  FeatureLists feature_lists = 2; }
    Features        { map<string, Feature> feature = 1; }          map entry: key = 1, value = 2
    FeatureLists    { map<string, FeatureList> feature_list = 1; } map entry: key = 1, value = 2
    FeatureList     { repeated Feature feature = 1; }
    Feature         { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }   (unpacked also accepted)
    Int64List { repeated int64 value = 1 [packed = true]; }   (unpacked also accepted)

A decoded feature value is a `list` of bytes (bytes_list), a float32 array (float_list) or an int64
array (int64_list); a Feature with no kind set decodes to None.
"""
import collections
import dataclasses
import functools
import os
import struct

import crc32c
import numpy as np

from engine.errors import SampleError

_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_EMPTY_CRC = 0x07980329       # masked_crc of the length field of an empty record (8 zero bytes)


class CorruptRecord(SampleError):
    """A record whose framing or CRC is wrong, or whose payload cannot be decoded."""

    def __init__(self, path, offset, reason):
        self.path, self.offset, self.reason = str(path), int(offset), reason
        super().__init__(f"{path}: corrupt record at byte offset {offset}: {reason}")

    def __reduce__(self):  # keep it picklable across DataLoader worker processes
        return type(self), (self.path, self.offset, self.reason)


class DecodeError(ValueError):
    """Bytes that are not a valid protobuf message of the expected type."""


def masked_crc(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# --------------------------------------------------------------------------------------- framing

def _frame(data):
    header = struct.pack("<Q", len(data))
    return header + _U32.pack(masked_crc(header)) + data + _U32.pack(masked_crc(data))


def write_records(path, records):
    """Write `records` (bytes each) as one TFRecord file; a temp file is renamed into place."""
    tmp = f"{path}.partial"
    with open(tmp, "wb") as f:
        for data in records:
            f.write(_frame(bytes(data)))
    os.replace(tmp, path)


def _parse_header(head, offset, size):
    """(data length, None) for a sound 12-byte header at `offset`, else (None, (kind, reason))."""
    if len(head) < _HEADER.size:
        return None, ("truncated", f"truncated header ({len(head)} of 12 bytes; file has {size} "
                                   f"bytes)")
    length, crc = _HEADER.unpack(head)
    if masked_crc(head[:8]) != crc:
        return None, ("bad_header", "length CRC mismatch")
    end = offset + _HEADER.size + length + 4
    if end > size:
        return None, ("truncated", f"truncated record (needs {end} bytes, file has {size})")
    return length, None


def _read_header(f, path, offset, size):
    """Return the data length of the record at `offset`, checking its length CRC and extent."""
    f.seek(offset)
    length, problem = _parse_header(f.read(_HEADER.size), offset, size)
    if problem:
        raise CorruptRecord(path, offset, problem[1])
    return length


def _body_ok(f, offset, length):
    """Whether the `length` data bytes after the header at `offset` match their data CRC."""
    f.seek(offset + _HEADER.size)
    body = f.read(length + 4)
    return len(body) == length + 4 and masked_crc(body[:length]) == _U32.unpack(body[length:])[0]


# ---------------------------------------------------------------------------- damage and resync

@dataclasses.dataclass
class Damage:
    """One unreadable byte range of a file and the records it cost.

    kind: "truncated" (the file ends inside a header or a record), "bad_header" (length CRC
    mismatch), "data_crc" (found with `check_crc`), "unreadable" (a whole file, e.g. a pkl).
    `end`: where reading resumed, or the file size; `tail`: nothing after `offset` was readable.
    `bytes_lost`: end - offset, except for a tail when the size the file should have is known
    (then it runs to that size). `records_lost` is exact (`exact`), an estimate from `bytes_lost`
    and the mean record size, or, with `lower_bound`, only what is certain.
    """
    path: str
    offset: int
    end: int
    kind: str
    reason: str
    tail: bool = False
    records_lost: int = 1
    exact: bool = True
    lower_bound: bool = False
    bytes_lost: int = None

    def __post_init__(self):
        if self.bytes_lost is None:
            self.bytes_lost = self.end - self.offset

    def lost_text(self, unit="record"):
        n = self.records_lost
        text = f"{n} {unit}{'' if n == 1 else 's'}"
        if self.lower_bound:
            return "at least " + text
        return text if self.exact else "about " + text

    def error(self, with_loss=True):
        """The SampleError for this spot; with the records lost, so that a "skipped sample" line
        does not read as one lost sample."""
        reason = f"{self.reason}; {self.lost_text()} lost" if with_loss else self.reason
        if self.kind == "unreadable":
            return SampleError(f"{self.path}: {reason}")
        return CorruptRecord(self.path, self.offset, reason)


class Scan(collections.namedtuple("Scan", "offsets damage size record_bytes")):
    """What `scan_records` found: readable record offsets, Damage list (file order), file size,
    framed bytes of the readable records."""

    @property
    def mean_record_size(self):
        return self.record_bytes / len(self.offsets) if self.offsets else None


@functools.lru_cache(maxsize=1)
def _crc8_tables():
    """Four 16-bit lookup tables giving the CRC-32C of an 8-byte message held as a uint64.

    CRC-32C (reflected, polynomial 0x82F63B78) is linear over XOR once the initial value is folded
    into the first 4 bytes, so the CRC of bytes b0..b7 is the XOR of one table entry per byte pair
    (slicing-by-8, with pairs of byte tables merged into 16-bit tables).
    """
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    by_position = [t]                  # by_position[k][v]: byte v followed by k zero bytes
    for _ in range(7):
        prev = by_position[-1]
        by_position.append((prev >> 8) ^ t[prev & 0xFF])
    v = np.arange(1 << 16, dtype=np.uint32)
    # byte j of the message is followed by 7 - j bytes; pair k holds bytes 2k (low), 2k + 1 (high)
    return [by_position[7 - 2 * k][v & 0xFF] ^ by_position[6 - 2 * k][v >> 8] for k in range(4)]


def masked_crc_u64(values):
    """masked_crc of the 8 little-endian bytes of each uint64 in `values`, for many at once."""
    tables = _crc8_tables()
    x = np.asarray(values, np.uint64) ^ np.uint64(0xFFFFFFFF)   # the initial value, folded in
    crc = tables[0][(x & np.uint64(0xFFFF)).astype(np.intp)]
    for k in range(1, 4):
        crc ^= tables[k][((x >> np.uint64(16 * k)) & np.uint64(0xFFFF)).astype(np.intp)]
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def _header_candidates(buf, base, n, size):
    """Offsets in [base, base + n) whose 12 bytes in `buf` (read from `base`, n + 11 bytes long) are
    a header with a matching length CRC and a record that fits in a file of `size` bytes."""
    # the uint64 length and the uint32 length CRC starting at every byte: unaligned views, no copy
    lengths = np.ndarray((n,), "<u8", buffer=buf, strides=(1,))
    stored = np.ndarray((n,), "<u4", buffer=buf, offset=8, strides=(1,))
    room = size - _HEADER.size - 4 - base    # the longest data that fits at `base`
    zero = lengths == 0                      # decided without a CRC: zero-filled regions are common
    ok = (lengths <= np.uint64(room)) & ~zero
    cand = np.flatnonzero(ok)
    cand = cand[lengths[cand] <= (room - cand).astype(np.uint64)]
    cand = cand[masked_crc_u64(lengths[cand]) == stored[cand]]
    empty = np.flatnonzero(zero & (stored == _EMPTY_CRC))
    return base + np.union1d(cand, empty) if len(empty) else base + cand


def find_next_record(f, start, size, check_crc=False, chunk=1 << 21):
    """The first offset >= `start` where a record can be read, or None.

    A byte-by-byte search for a 12-byte header with a matching length CRC whose record fits in the
    file (and, with `check_crc`, whose data CRC matches). It runs in numpy over `chunk`-byte blocks
    and is not bounded, so a damaged region costs only the records inside it, seconds of CPU for
    hundreds of megabytes (docs/performance.md#reader-figures). A false match in random bytes needs a
    32-bit CRC and a length below the file size to agree by chance.
    """
    last = size - _HEADER.size - 4            # the last offset where an empty record fits
    pos = start
    while pos <= last:
        n = min(chunk, last - pos + 1)
        f.seek(pos)
        buf = f.read(n + _HEADER.size - 1)
        for p in _header_candidates(buf, pos, n, size).tolist():
            if not check_crc:
                return p
            f.seek(p)
            length, _ = _HEADER.unpack(f.read(_HEADER.size))
            if _body_ok(f, p, length):
                return p
        pos += n
    return None


_MAX_GAP_CHECK = 1 << 26


def _one_record_gap(f, offset, end):
    """Whether [offset, end) is exactly one record with a broken header and an intact body (its
    data CRC, at end - 4, matches the bytes between the header and it)."""
    length = end - offset - _HEADER.size - 4
    return 0 <= length <= _MAX_GAP_CHECK and _body_ok(f, offset, length)


def scan_records(path, check_crc=False, stop_at_first=False):
    """Offsets of the readable records of `path` and the damaged ranges between and after them.

    Only the 12-byte headers are read, unless `check_crc` (then every record's data CRC is checked,
    which reads the whole file). After a bad length CRC the scan resynchronises at the next
    readable record (`find_next_record`), so a damaged region loses only the records inside it; a
    file that ends inside a header or record ends the scan. `stop_at_first` returns at the first
    damage (strict readers raise it anyway). Records lost are counted by `estimate_losses`.
    """
    offsets, damage, record_bytes = [], [], 0
    size = os.path.getsize(path)
    offset = 0
    with open(path, "rb") as f:
        while offset < size:
            f.seek(offset)
            length, problem = _parse_header(f.read(_HEADER.size), offset, size)
            if problem is None and check_crc and not _body_ok(f, offset, length):
                problem = ("data_crc", "data CRC mismatch")
            if problem is None:
                offsets.append(offset)
                record_bytes += _HEADER.size + length + 4
                offset += _HEADER.size + length + 4
                continue
            kind, reason = problem
            if kind == "data_crc":                # the header is sound: the next record follows
                end = offset + _HEADER.size + length + 4
                damage.append(Damage(path, offset, end, kind, reason))
            elif kind == "truncated" or stop_at_first:
                end = size
                damage.append(Damage(path, offset, end, kind, reason, tail=True))
            else:
                end = find_next_record(f, offset + 1, size, check_crc)
                if end is None:
                    end = size
                    damage.append(Damage(path, offset, end, kind, reason + "; no readable record "
                                         "after it", tail=True))
                else:
                    damage.append(Damage(path, offset, end, kind, f"{reason}; reading resumes at "
                                         f"byte {end}", exact=_one_record_gap(f, offset, end)))
            if stop_at_first:
                break
            offset = end
    return estimate_losses(Scan(offsets, damage, size, record_bytes))


def estimate_losses(scan, mean_record_size=None, expected_size=None):
    """`scan` with the records lost filled in where they are not known exactly.

    mean record size: the file's own readable records, else `mean_record_size`. A tail runs to
    `expected_size` (the size the file should have, e.g. that of its sibling shards) when that is
    larger than the file. A file that ends inside a record, with no expected size, only certainly
    lost that record: a lower bound of 1.
    """
    mean = scan.mean_record_size or mean_record_size
    out = []
    for d in scan.damage:
        if d.exact and not d.tail:
            out.append(d)
            continue
        lost_bytes = d.end - d.offset
        if d.tail and expected_size:
            lost_bytes = max(lost_bytes, expected_size - d.offset)
        records = max(1, round(lost_bytes / mean)) if mean else 1
        lower = not mean or (d.tail and d.kind == "truncated" and not expected_size)
        out.append(dataclasses.replace(d, bytes_lost=lost_bytes, exact=False, lower_bound=lower,
                                       records_lost=1 if lower else records))
    return scan._replace(damage=out)


def index_records(path):
    """Byte offsets of all records in `path`; raises CorruptRecord on a framing error."""
    scan = scan_records(path, stop_at_first=True)
    if scan.damage:
        raise scan.damage[0].error(with_loss=False)
    return scan.offsets


def read_record(path, offset):
    """The data of the record at `offset` (its own bytes object), both CRCs checked."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return _read_body(f, path, offset, _read_header(f, path, offset, size))


def _read_body(f, path, offset, length):
    """The record's data after its header, checked against the data CRC."""
    body = f.read(length + 4)
    data = body[:length]
    if masked_crc(data) != _U32.unpack(body[length:])[0]:
        raise CorruptRecord(path, offset, "data CRC mismatch")
    return data


def iter_records(path):
    """Yield the data of every record in file order; raises CorruptRecord at the first bad one."""
    size = os.path.getsize(path)
    offset = 0
    with open(path, "rb") as f:
        while offset < size:
            length = _read_header(f, path, offset, size)
            yield _read_body(f, path, offset, length)
            offset += _HEADER.size + length + 4


# ------------------------------------------------------------------------------ protobuf decoding

def _varint(buf, pos):
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result, shift = b & 0x7F, 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _fields(buf, start, end):
    """Yield (field number, wire type, value) over buf[start:end]; length-delimited values come
    as a (start, end) pair so nested messages are not copied."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value = (pos, pos + n)
            pos += n
        elif wire == 5:
            value = (pos, pos + 4)
            pos += 4
        elif wire == 1:
            value = (pos, pos + 8)
            pos += 8
        else:
            raise DecodeError(f"unsupported wire type {wire} for field {field}")
        if pos > end:
            raise DecodeError(f"field {field} runs past the end of its message")
        yield field, wire, value


def _signed64(v):
    return v - (1 << 64) if v >= (1 << 63) else v


def _decode_feature(buf, start, end):
    value = None
    for field, wire, val in _fields(buf, start, end):
        if field == 1 and wire == 2:        # bytes_list
            value = [bytes(buf[v[0]:v[1]]) for f, w, v in _fields(buf, *val) if f == 1 and w == 2]
        elif field == 2 and wire == 2:      # float_list
            parts = []
            for f, w, v in _fields(buf, *val):
                if f == 1 and w in (2, 5):  # packed run or one unpacked fixed32
                    s, e = v
                    if (e - s) % 4:
                        raise DecodeError("packed float run is not a multiple of 4 bytes")
                    parts.append(np.frombuffer(buf[s:e], dtype="<f4"))
            value = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
        elif field == 3 and wire == 2:      # int64_list
            ints = []
            for f, w, v in _fields(buf, *val):
                if f != 1:
                    continue
                if w == 0:
                    ints.append(_signed64(v))
                elif w == 2:
                    pos, stop = v
                    while pos < stop:
                        x, pos = _varint(buf, pos)
                        ints.append(_signed64(x))
                    if pos != stop:
                        raise DecodeError("packed int64 run overruns its length")
            value = np.array(ints, dtype=np.int64)
    return value


def _decode_map(buf, start, end, decode_value, wanted=None):
    """map<string, V> field 1 of a message: entries are {key = 1, value = 2} messages."""
    out = {}
    for field, wire, span in _fields(buf, start, end):
        if field != 1 or wire != 2:
            continue
        key, value_span = "", None
        for f, w, v in _fields(buf, *span):
            if f == 1 and w == 2:
                key = bytes(buf[v[0]:v[1]]).decode("utf-8")
            elif f == 2 and w == 2:
                value_span = v
        if wanted is not None and key not in wanted:
            continue
        out[key] = decode_value(buf, *(value_span or (0, 0)))
    return out


def _decode_feature_list(buf, start, end):
    return [_decode_feature(buf, *v) for f, w, v in _fields(buf, start, end) if f == 1 and w == 2]


def decode_sequence_example(data, feature_lists=None, context_only=False):
    """Decode a serialized SequenceExample into (context, feature_lists) dicts.

    `feature_lists`: names to decode (others are skipped unparsed); None decodes all.
    Raises DecodeError on malformed bytes.
    """
    buf = data if isinstance(data, (bytes, memoryview)) else bytes(data)
    wanted = None if feature_lists is None else set(feature_lists)
    context, lists = {}, {}
    try:
        for field, wire, span in _fields(buf, 0, len(buf)):
            if field == 1 and wire == 2:
                context.update(_decode_map(buf, *span, _decode_feature))
            elif field == 2 and wire == 2 and not context_only:
                lists.update(_decode_map(buf, *span, _decode_feature_list, wanted))
    except IndexError:
        raise DecodeError("message ends inside a field") from None
    except UnicodeDecodeError:
        raise DecodeError("a feature name is not UTF-8") from None
    return context, lists


# ------------------------------------------------------------------------------ protobuf encoding

def _enc_varint(v):
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _enc_len(field, payload):
    return _enc_varint((field << 3) | 2) + _enc_varint(len(payload)) + payload


def encode_feature(value):
    """Feature message for a value: bytes/str or a list of them -> bytes_list; a float array or
    list of floats -> float_list (packed); an int array or list of ints -> int64_list (packed).
    An empty list becomes an empty bytes_list."""
    if isinstance(value, (bytes, str)):
        value = [value]
    if isinstance(value, np.ndarray):
        arr = value.ravel()
    elif len(value) and isinstance(value[0], (bytes, bytearray, str)):
        arr = None
    elif len(value):
        arr = np.asarray(value)
    else:
        arr = None
    if arr is None:
        items = b"".join(_enc_len(1, v.encode("utf-8") if isinstance(v, str) else bytes(v))
                         for v in value)
        return _enc_len(1, items)
    if np.issubdtype(arr.dtype, np.floating):
        packed = arr.astype("<f4").tobytes()
        return _enc_len(2, _enc_len(1, packed) if len(arr) else b"")
    if np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        packed = b"".join(_enc_varint(int(x)) for x in arr)
        return _enc_len(3, _enc_len(1, packed) if len(arr) else b"")
    raise TypeError(f"cannot encode a feature of dtype {arr.dtype}")


def _enc_map(entries):
    return b"".join(_enc_len(1, _enc_len(1, key.encode("utf-8")) + _enc_len(2, value))
                    for key, value in entries)


def encode_sequence_example(context, feature_lists):
    """Serialize a SequenceExample. `context`: {name: value}; `feature_lists`: {name: [value, ...]}
    with values as in `encode_feature`."""
    ctx = _enc_map((k, encode_feature(v)) for k, v in context.items())
    fls = _enc_map((k, b"".join(_enc_len(1, encode_feature(v)) for v in frames))
                   for k, frames in feature_lists.items())
    return _enc_len(1, ctx) + _enc_len(2, fls)
