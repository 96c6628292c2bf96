"""The pixel count an encoded image declares in its header, read without decoding it.

A few hundred bytes can declare an image of 30,000 × 30,000 pixels, which `decode` would allocate
(2.7 GB as uint8 RGB, per decode, several decodes at once): the pipeline reads the declared size
first and skips an image over `dataset.max_image_pixels` without decoding it.

`declared_pixels` covers every format `tf.io.decode_image` decodes, recognised by the same
signatures: PNG (IHDR), GIF (the logical screen), BMP (the DIB header), WebP (VP8, VP8L and VP8X
chunks), JPEG (`tf.io.extract_jpeg_shape`, which reads the markers up to the frame header) and
JPEG XL (the codestream's SizeHeader, bare or in its container's first `jxlc`/`jxlp` box).

It runs for every record, so it is a handful of ops: one gather and one weighted sum over the
first 32 bytes for the fixed-offset fields; JPEG and JPEG XL (bit-packed, parsed in Python by
`jxl_pixels`) in branches of their own.
"""

import numpy as np
import tensorflow as tf

_HEAD = 32  # the bytes the fixed-offset fields lie in

# Each field: the bytes it is made of, least significant first (-1: none), over the first _HEAD.
_FIELDS = {
  "png_w": (19, 18, 17, 16),  # IHDR, big-endian
  "png_h": (23, 22, 21, 20),
  "gif_w": (6, 7, -1, -1),  # the logical screen, little-endian
  "gif_h": (8, 9, -1, -1),
  "bmp_header": (14, 15, 16, 17),  # the DIB header's size: 12 is BITMAPCOREHEADER
  "bmp_core_w": (18, 19, -1, -1),
  "bmp_core_h": (20, 21, -1, -1),
  "bmp_w": (18, 19, 20, 21),  # the later headers: signed 32-bit, a negative height top-down
  "bmp_h": (22, 23, 24, 25),
  "vp8_w": (26, 27, -1, -1),  # 'VP8 ' key frame: 14 bits each (2 bits of scale above)
  "vp8_h": (28, 29, -1, -1),
  "vp8l": (21, 22, 23, 24),  # 'VP8L': 14 bits width - 1, 14 bits height - 1
  "vp8x_w": (24, 25, 26, -1),  # 'VP8X' canvas: 24 bits width - 1, height - 1
  "vp8x_h": (27, 28, 29, -1),
}
_INDEX = np.maximum(np.array(list(_FIELDS.values())), 0)
_WEIGHT = np.where(np.array(list(_FIELDS.values())) >= 0, 256 ** np.arange(4), 0)

# Signatures (bytes at offsets 0.. and 8..; None: any byte), in the order of `areas` below.
_SIGNATURES = {
  "png": b"\x89PNG\r\n\x1a\n",
  "gif": b"GIF8",
  "bmp": b"BM",
  "vp8": b"RIFF\0\0\0\0WEBPVP8 ",
  "vp8l": b"RIFF\0\0\0\0WEBPVP8L",
  "vp8x": b"RIFF\0\0\0\0WEBPVP8X",
  "jpeg": b"\xff\xd8\xff",
  "jxl": b"\xff\x0a",
  "jxl_box": b"\0\0\0\x0cJXL \r\n\x87\n",
}
_SIG_BYTES = np.zeros((len(_SIGNATURES), 16), np.int64)
_SIG_CARE = np.zeros((len(_SIGNATURES), 16), bool)
for _row, (_name, _sig) in enumerate(_SIGNATURES.items()):
  _SIG_BYTES[_row, : len(_sig)] = list(_sig)
  _SIG_CARE[_row, : len(_sig)] = True
  if _sig.startswith(b"RIFF"):
    _SIG_CARE[_row, 4:8] = False  # the RIFF size


def _fixed_areas(head: tf.Tensor) -> tf.Tensor:
  """int64 [6]: the area each fixed-offset format (png .. vp8x) would declare."""
  values = tf.unstack(tf.reduce_sum(tf.gather(head, _INDEX) * _WEIGHT, axis=1))
  f = dict(zip(_FIELDS, values, strict=True))
  core = tf.equal(f["bmp_header"], 12)

  def signed(v):
    return tf.abs(tf.where(v >= 2**31, v - 2**32, v))

  bmp_w = tf.where(core, f["bmp_core_w"], signed(f["bmp_w"]))
  bmp_h = tf.where(core, f["bmp_core_h"], signed(f["bmp_h"]))
  return tf.stack(
    [
      tf.minimum(f["png_w"], 2**31) * tf.minimum(f["png_h"], 2**31),
      f["gif_w"] * f["gif_h"],
      bmp_w * bmp_h,
      (f["vp8_w"] % 2**14) * (f["vp8_h"] % 2**14),
      (f["vp8l"] % 2**14 + 1) * (f["vp8l"] // 2**14 % 2**14 + 1),
      (f["vp8x_w"] + 1) * (f["vp8x_h"] + 1),
    ]
  )


def declared_pixels(encoded: tf.Tensor) -> tf.Tensor:
  """Width × height declared by the header of `encoded` (string scalar): int64 scalar, -1 for
  bytes of no format `tf.io.decode_image` reads. Errors only where a JPEG's markers are broken
  (the pipeline then counts the record as undecodable)."""
  padded = tf.strings.join([tf.strings.substr(encoded, 0, _HEAD), b"\0" * _HEAD])
  head = tf.cast(tf.io.decode_raw(padded, tf.uint8)[:_HEAD], tf.int64)
  matches = tf.reduce_all(tf.equal(head[:16], _SIG_BYTES) | ~_SIG_CARE, axis=1)
  fixed, jpeg, jxl = matches[:6], matches[6], matches[7] | matches[8]
  area = tf.where(tf.reduce_any(fixed), tf.reduce_sum(tf.where(fixed, _fixed_areas(head), 0)), -1)

  def jpeg_or_jxl():
    def jpeg_area():
      shape = tf.io.extract_jpeg_shape(encoded, output_type=tf.int64)
      return shape[0] * shape[1]

    def jxl_area():
      return tf.reshape(tf.numpy_function(jxl_pixels, [encoded], tf.int64, stateful=False), [])

    return tf.cond(jpeg, jpeg_area, jxl_area)

  return tf.cond(jpeg | jxl, jpeg_or_jxl, lambda: area)


# ---------------------------------------------------------------------------------------------
# JPEG XL (ISO/IEC 18181-1), in Python.


def _jxl_codestream_start(data: bytes) -> int:
  """Where the codestream (0xFF 0x0A) starts: 0 bare; in the container, after the type of the
  first 'jxlc' box or after the type and 4-byte index of the first 'jxlp' box; -1 if not found."""
  if data[:2] == b"\xff\x0a":
    return 0
  pos = 0
  while pos + 8 <= len(data):
    size, kind = int.from_bytes(data[pos : pos + 4], "big"), data[pos + 4 : pos + 8]
    header = 8
    if size == 1:  # a 64-bit size follows the type
      size, header = int.from_bytes(data[pos + 8 : pos + 16], "big"), 16
    if kind == b"jxlc":
      return pos + header
    if kind == b"jxlp":
      return pos + header + 4
    if size < header:  # 0: the box runs to the end of the file; less: damaged
      return -1
    pos += size
  return -1


def jxl_pixels(data: bytes) -> np.int64:
  """Width × height of a JPEG XL image's SizeHeader (bits least significant first: a flag for
  sizes in multiples of 8, the height, a ratio code, the width unless the ratio gives it);
  -1 where no codestream is found."""
  if isinstance(data, np.ndarray):  # as tf.numpy_function passes a string scalar
    data = data.item()
  start = _jxl_codestream_start(data)
  if start < 0 or data[start : start + 2] != b"\xff\x0a":
    return np.int64(-1)
  bits = int.from_bytes(bytes(data[start + 2 : start + 14]).ljust(12, b"\0"), "little")
  pos = 0

  def read(n):
    nonlocal pos
    value = (bits >> pos) & ((1 << n) - 1)
    pos += n
    return value

  def size(small):
    if small:
      return (read(5) + 1) * 8
    return read((9, 13, 18, 30)[read(2)]) + 1

  small = read(1)
  height = size(small)
  ratio = read(3)
  if ratio == 0:
    width = size(small)
  else:
    numerator, denominator = ((1, 1), (12, 10), (4, 3), (3, 2), (16, 9), (5, 4), (2, 1))[ratio - 1]
    width = height * numerator // denominator
  return np.int64(min(width, 2**31) * min(height, 2**31))  # sides capped: no int64 overflow
