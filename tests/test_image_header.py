"""The pixel count an image's header declares, read without decoding (image_header), held to
what tf.io.decode_image decodes, for every format it decodes; and a PNG that declares
30,000 x 30,000 pixels in 69 bytes."""

import io
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vit_jax.input_pipeline.ops import image_header


def _declared(data: bytes) -> int:
  return int(image_header.declared_pixels(tf.constant(data)))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
  return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
  """A valid PNG signature, an IHDR declaring width x height RGB pixels, a short IDAT."""
  ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  idat = zlib.compress(b"\0" * 64)
  return (
    b"\x89PNG\r\n\x1a\n"
    + _png_chunk(b"IHDR", ihdr)
    + _png_chunk(b"IDAT", idat)
    + _png_chunk(b"IEND", b"")
  )


@pytest.mark.parametrize(
  "fmt, options",
  [
    ("PNG", {}),
    ("JPEG", {}),
    ("JPEG", {"progressive": True}),
    ("GIF", {}),
    ("BMP", {}),
    ("WEBP", {"lossless": False}),  # 'VP8 '
    ("WEBP", {"lossless": True}),  # 'VP8L'
    ("WEBP_ALPHA", {"lossless": False}),  # 'VP8X' (an alpha channel)
  ],
)
def test_declared_pixels_are_what_decode_image_decodes(fmt, options):
  rng = np.random.default_rng(0)
  for height, width in [(1, 1), (7, 300), (257, 3), (40, 41)]:
    channels = 4 if fmt == "WEBP_ALPHA" else 3
    image = Image.fromarray(rng.integers(0, 256, (height, width, channels), dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, format=fmt.split("_")[0], **options)
    data = out.getvalue()
    decoded = tf.io.decode_image(data, expand_animations=False)
    assert decoded.shape[:2] == (height, width)
    assert _declared(data) == height * width, (fmt, height, width)


# JPEG XL, encoded by libjxl (imagecodecs 2026.3.6, effort 1): a bare codestream of 8 x 8 pixels
# and a 7 x 9 one in the ISO BMFF container; decoded below by TensorFlow.
JXL_8X8 = bytes.fromhex(
  "ff0a41402408020100f8074b189b9c71840338800338204ac039050100204480081001224084fff7eff9efa131e79c6b"
  "ed736f922409015555555555d5ffffff73efebeeeeee86fff7eff9efa131e79c6bed736f922409015555555555d5ffff"
  "ff73efebeeeeee86fff7eff9efa131e79c6bed736f922409015555555555d5ffffff73efebeeeeee86fff7eff9efa131"
  "e79c6bed736f922409015555555555d5ffffff73efebeeeeeebe4004011cfa18576ed5e52fae61bc54cd953adb83e77a"
  "1ee2423c8206ed2178152ecc15bc9297f69c277b601ce2da5e2f8e7ce44b7b5daec09ef33c7466aedec3e1ca5dce47d2"
  "4538deb5b96887583c79c60d97a2d899a78f7ac62567e1b46739d4f82360fef81b1e07473ceea1aef38539e7557a389d"
  "e9208f81a33c2e2ec743e84a5c9ee35c85731ff4e1b47b323c06965fa2435cc06bb2eba171fd2ed4757ac05d85f6e171"
  "be5393d71fe46c6b6277cccd8be68ece710f74acf33797f25c17f9923e56cffce03bd9557eb05d9347cf43f431d79cf0"
  "a17155afc685ba560fa26b7059563ec61e56d7e15a3fe88e3cadc7d6d687cb63ece1f508ba308fad07d7a91e45c7bca0"
  "8fd6839fe1ec07be1a97ec123cfac2836871b5fc08e73a4e373b313d729a1d614b1a5d33d02eecfa63d8f946361ee74c"
  "c7dd347bf44d87d8357cdea3ceee5b53ee9c3df2d6993d273cd471ec8cd5f25d69cba2ad474967a900"
)
JXL_7X9_CONTAINER = bytes.fromhex(
  "0000000c4a584c200d0a870a00000014667479706a786c20000000006a786c200000020c6a786c63ff0a303010090802"
  "0100e0074b189b9c71840338800338204ac039050100204480081001224084fff7eff9efa131e79c6bed7b4f92240901"
  "5555555555d5ffffff73efebeeeeee86fff7eff9efa131e79c6bed736f922409015555555555d5ffffff73efebeeeeee"
  "86fff7eff9efa131e79c6bed736f922409015555555555d5ffffff73efebeeeeee86fff7eff9efa131e79c6bed736f92"
  "2409015555555555d5ffffff73efebeeeeeebe4000012c6956ccac3ce8e4fcf91ea8c76cfdaefa49f3981e73a31e8b43"
  "9d6be793e61c8fd713f214ab372d3fcdb366ed03f8583f3c8fd4ca27c133e3c13dd4b6658fdee99e48a739f8f3e0a9f0"
  "d83f4cf3bb773c848ff90377a8ad33cc86b9c39ce5ecc7185e7fdac36f7870363d678ef4481efe4cc7def6201cfb115e"
  "fe903c8f8ffea81ce3d4877a889bc7eaa19c78c8b73e364f90c7e984c7e91fb687ead13dc0e3f4603ea60fd779563d08"
  "8738d383be61eb86f51cac38f6a3f4e43cc6b363cbd3e659f070af7cd63e84fd819e78cfef27f823718cbda77f2a9ded"
  "0179689fb94fa9c7f909f5083e42e9e15efc3c58f8403d331e89a7ca291eb5476ed1a3f3e4e8279f17c73ed1b2333f23"
  "66671ffec7e4517a429dffe87e8ec191e1edab27db9135bb36ac9adcb06360d71e5f3dd9cfface7d4729c3ecc2998395"
  "436718deed43c5ae5da1d974ac931ca79ad9b274d9c6f923cded2901"
)
# The first bytes of larger ones (each size header's other encodings: 32-bit fields, the fixed
# aspect ratios), with the sizes tf.io.decode_image gave for the whole files.
JXL_HEADERS = {
  (5, 37): "ff0a2000488048080201008d024b189b9c718403",
  (200, 300): "ff0a3141240802010090020000a05c97a0f50b00",  # ratio 3:2
  (90, 160): "ff0ac852100908020100a6ef014b189b9c718403",  # ratio 16:9
  (513, 1): "ff0a0210000088040802010080020000501a5016",
  (3, 5000): "ff0a10800e278804080201008002000000000010",
  (256, 512): "ff0aff4124080201008c0200002005c62006c600",  # ratio 2:1
  (300, 41): "0000000c4a584c200d0a870a00000014667479706a786c20000000006a786c200000a5256a786c63"
  "ff0a58095080480802010090020000601212d006054b189b",  # in the container
}


def test_jpeg_xl_sizes_bare_and_in_the_container():
  for data, (height, width) in ((JXL_8X8, (8, 8)), (JXL_7X9_CONTAINER, (7, 9))):
    assert tf.io.decode_image(data, channels=3).shape[:2] == (height, width)
    assert _declared(data) == height * width
  for (height, width), head in JXL_HEADERS.items():
    assert _declared(bytes.fromhex(head)) == height * width, (height, width)
  # Other boxes first (one with a 64-bit size), the codestream in a 'jxlp' box after its index.
  signature = JXL_7X9_CONTAINER[:32]  # 'JXL ' and 'ftyp'
  exif = struct.pack(">I", 1) + b"Exif" + struct.pack(">Q", 16 + 6) + b"jxlc.."
  jxlp = struct.pack(">I", 12 + len(JXL_8X8)) + b"jxlp" + b"\0\0\0\0" + JXL_8X8
  assert _declared(signature + exif + jxlp) == 8 * 8
  assert _declared(signature + exif) == -1  # no codestream


def test_a_bomb_declares_its_size_and_other_bytes_declare_none():
  data = bomb_png()
  assert len(data) < 100 and _declared(data) == 30_000 * 30_000
  assert _declared(bomb_png(2**32 - 1, 2**32 - 1)) == 2**62  # capped sides: no int64 overflow
  assert _declared(b"") == _declared(b"not an image at all") == _declared(b"\x89PN") == -1
  with pytest.raises(tf.errors.InvalidArgumentError):  # broken JPEG markers: undecodable
    _declared(b"\xff\xd8\xff\xe0 broken")
