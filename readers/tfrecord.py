"""TFRecord files and `tf.train.SequenceExample` messages without TensorFlow.

Framing of one record (little-endian), as written by TensorFlow's RecordWriter:

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)
    masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (mod 2**32)

Random access needs the byte offset of each record: `scan_records` walks the headers only (it checks
the length CRC, because a bad length would send the walk into garbage) and `read_record` checks the
data CRC when the record is read. Compressed (GZIP/ZLIB) TFRecords are not supported.

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
import os
import struct

import crc32c
import numpy as np

from engine.data import SampleError

_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


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


def _read_header(f, path, offset, size):
    """Return the data length of the record at `offset`, checking its length CRC and extent."""
    f.seek(offset)
    head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise CorruptRecord(path, offset, f"truncated header ({len(head)} of 12 bytes; file has "
                                          f"{size} bytes)")
    length, crc = _HEADER.unpack(head)
    if masked_crc(head[:8]) != crc:
        raise CorruptRecord(path, offset, "length CRC mismatch")
    end = offset + _HEADER.size + length + 4
    if end > size:
        raise CorruptRecord(path, offset, f"truncated record (needs {end} bytes, file has {size})")
    return length


def scan_records(path):
    """Offsets of the records of `path` up to the first framing error, and that error (or None).

    Only the 12-byte headers are read. After a bad length CRC or a truncation nothing that follows
    can be located, so the scan stops there.
    """
    offsets = []
    size = os.path.getsize(path)
    offset = 0
    with open(path, "rb") as f:
        while offset < size:
            try:
                length = _read_header(f, path, offset, size)
            except CorruptRecord as e:
                return offsets, e
            offsets.append(offset)
            offset += _HEADER.size + length + 4
    return offsets, None


def index_records(path):
    """Byte offsets of all records in `path`; raises CorruptRecord on a framing error."""
    offsets, error = scan_records(path)
    if error is not None:
        raise error
    return offsets


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
