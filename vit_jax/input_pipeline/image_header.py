"""The pixel count an encoded image declares in its header, read without decoding it.

A few hundred bytes can declare an image of 30,000 × 30,000 pixels, which `decode` would allocate
(2.7 GB as uint8 RGB, per decode, several decodes at once): the pipeline reads the declared size
first and skips an image over `dataset.max_image_pixels` without decoding it.

`declared_pixels` covers every format `tf.io.decode_image` decodes, recognised by the same
signatures: PNG (IHDR), GIF (the logical screen), BMP (the DIB header), WebP (VP8, VP8L and VP8X
chunks), JPEG (`tf.io.extract_jpeg_shape`, which reads the markers up to the frame header) and
JPEG XL (the codestream's SizeHeader, bare or in its container's first `jxlc`/`jxlp` box). Only
the branch of the image's format runs. TensorFlow ops only, traced inside tf.data.
"""

import tensorflow as tf

_HEAD = 32  # bytes read at fixed offsets (the JPEG XL size header is found by search)


def _head(encoded: tf.Tensor, start=0) -> tf.Tensor:
  """int64 [_HEAD]: the bytes of `encoded` from `start`, zeros past its end (never an error)."""
  start = tf.minimum(tf.cast(start, tf.int32), tf.strings.length(encoded))
  padded = tf.strings.join([tf.strings.substr(encoded, start, _HEAD), b"\0" * _HEAD])
  return tf.cast(tf.io.decode_raw(padded, tf.uint8)[:_HEAD], tf.int64)


def _le(head: tf.Tensor, offset: int, size: int) -> tf.Tensor:
  return sum(head[offset + i] * (1 << (8 * i)) for i in range(size))


def _be(head: tf.Tensor, offset: int, size: int) -> tf.Tensor:
  return sum(head[offset + i] * (1 << (8 * (size - 1 - i))) for i in range(size))


def _area(width: tf.Tensor, height: tf.Tensor) -> tf.Tensor:
  """width × height, each side capped at 2**31 so that the product cannot overflow int64."""
  return tf.minimum(width, 2**31) * tf.minimum(height, 2**31)


def _starts(head: tf.Tensor, signature: bytes, offset: int = 0) -> tf.Tensor:
  return tf.reduce_all(tf.equal(head[offset : offset + len(signature)], list(signature)))


def _png(head):
  return _area(_be(head, 16, 4), _be(head, 20, 4))


def _gif(head):
  return _le(head, 6, 2) * _le(head, 8, 2)


def _bmp(head):
  # BITMAPCOREHEADER (12 bytes): 16-bit sizes; the later headers: signed 32-bit (a negative
  # height is a top-down image).
  def signed(v):
    return tf.abs(tf.where(v >= 2**31, v - 2**32, v))

  core = tf.equal(_le(head, 14, 4), 12)
  width = tf.where(core, _le(head, 18, 2), signed(_le(head, 18, 4)))
  height = tf.where(core, _le(head, 20, 2), signed(_le(head, 22, 4)))
  return _area(width, height)


def _webp(head):
  lossy = (_le(head, 26, 2) % 2**14) * (_le(head, 28, 2) % 2**14)  # 'VP8 ' key frame
  bits = _le(head, 21, 4)  # 'VP8L': 14 bits width - 1, 14 bits height - 1
  lossless = (bits % 2**14 + 1) * (bits // 2**14 % 2**14 + 1)
  extended = (_le(head, 24, 3) + 1) * (_le(head, 27, 3) + 1)  # 'VP8X' canvas
  return tf.case(
    [
      (_starts(head, b"VP8L", 12), lambda: lossless),
      (_starts(head, b"VP8X", 12), lambda: extended),
    ],
    default=lambda: lossy,
  )


def _jpeg(encoded):
  shape = tf.io.extract_jpeg_shape(encoded, output_type=tf.int64)
  return shape[0] * shape[1]


def _jxl_codestream(encoded, start):
  """The SizeHeader after the codestream's signature (0xFF 0x0A at `start`), bits LSB first."""
  head = _head(encoded, start + 2)[:12]
  bits = tf.reshape(tf.bitwise.right_shift(head[:, None], tf.range(8, dtype=tf.int64)) % 2, [-1])

  def read(pos, n):
    field = tf.bitwise.left_shift(tf.slice(bits, [pos], [n]), tf.range(n, dtype=tf.int64))
    return tf.reduce_sum(field), pos + n

  def u32(pos):  # a 2-bit selector, then 9, 13, 18 or 30 bits, plus one
    selector, pos = read(pos, 2)
    n = tf.gather(tf.constant([9, 13, 18, 30], tf.int64), selector)
    value, pos = read(pos, n)
    return value + 1, pos

  small, pos = read(tf.constant(0, tf.int64), 1)
  div8, pos8 = read(pos, 5)
  big, pos_big = u32(pos)
  height = tf.where(small == 1, (div8 + 1) * 8, big)
  pos = tf.where(small == 1, pos8, pos_big)
  ratio, pos = read(pos, 3)
  width_div8, _ = read(pos, 5)
  width_big, _ = u32(pos)
  numerator = tf.gather(tf.constant([1, 1, 12, 4, 3, 16, 5, 2], tf.int64), ratio)
  denominator = tf.gather(tf.constant([1, 1, 10, 3, 2, 9, 4, 1], tf.int64), ratio)
  own_width = tf.where(small == 1, (width_div8 + 1) * 8, width_big)
  width = tf.where(ratio == 0, own_width, height * numerator // denominator)
  return tf.where(_starts(_head(encoded, start), b"\xff\x0a"), _area(width, height), -1)


def _jxl_container(encoded):
  # The codestream starts after the first 'jxlc' box's type, or after the first 'jxlp' box's
  # type and its 4-byte index; -1 (refused) when neither is found.
  def find(box):
    before = tf.strings.split(encoded, box, maxsplit=1)
    return tf.where(tf.size(before) > 1, tf.strings.length(before[0]), -1)

  full, part = find("jxlc"), find("jxlp")
  start = tf.where((full >= 0) & ((part < 0) | (full < part)), full + 4, part + 8)
  return tf.cond(
    (full >= 0) | (part >= 0),
    lambda: _jxl_codestream(encoded, tf.cast(start, tf.int64)),
    lambda: tf.constant(-1, tf.int64),
  )


def declared_pixels(encoded: tf.Tensor) -> tf.Tensor:
  """Width × height declared by the header of `encoded` (string scalar): int64 scalar, -1 for
  bytes of no format `tf.io.decode_image` reads. Errors only where a JPEG's markers are broken
  (the pipeline then counts the record as undecodable)."""
  head = _head(encoded)
  return tf.case(
    [
      (_starts(head, b"\x89PNG\r\n\x1a\n"), lambda: _png(head)),
      (_starts(head, b"\xff\xd8\xff"), lambda: _jpeg(encoded)),
      (_starts(head, b"GIF8"), lambda: _gif(head)),
      (_starts(head, b"BM"), lambda: _bmp(head)),
      (_starts(head, b"RIFF") & _starts(head, b"WEBP", 8), lambda: _webp(head)),
      (_starts(head, b"\xff\x0a"), lambda: _jxl_codestream(encoded, tf.constant(0, tf.int64))),
      (_starts(head, b"\0\0\0\x0cJXL \r\n\x87\n"), lambda: _jxl_container(encoded)),
    ],
    default=lambda: tf.constant(-1, tf.int64),
    exclusive=False,
  )
