"""Google Cloud Storage (gs://) specifics: the client library, bucket and credentials checks
that end a run with one line, and the workdir lock's atomic steps on an object store: an object
created only if it does not exist yet, replaced only if it is still the version read.

Every other gs:// read and write goes through the libraries' own GCS clients: tf.io.gfile and
etils.epath (TensorFlow's GCS filesystem), TensorStore (Orbax's arrays). Orbax also asks
google-cloud-storage for the bucket's layout when it opens a gs:// checkpoint directory, and the
lock uses it here for writes with a generation precondition, which gfile cannot express.

This file must not import TensorFlow.
"""

import importlib.util
import os

# What the error for a missing client library tells the user to run (setup.py's bound).
CLIENT_REQUIREMENT = "google-cloud-storage>=3.17,<4"


def is_gcs(path: str | os.PathLike) -> bool:
  return os.fspath(path).startswith("gs://")


def split(path: str | os.PathLike) -> tuple[str, str]:
  """('bucket', 'object/name') of 'gs://bucket/object/name'."""
  bucket, _, name = os.fspath(path).removeprefix("gs://").partition("/")
  return bucket, name


def require_client(path: str | os.PathLike) -> None:
  """Raises a one-line ImportError when `path` is on gs:// and google-cloud-storage is missing
  (Orbax would fail deep inside with "cannot import name 'storage' from 'google.cloud'")."""
  if not is_gcs(path):
    return
  try:
    found = importlib.util.find_spec("google.cloud.storage") is not None
  except (ImportError, ValueError):  # no google.cloud namespace at all, or a blocked module
    found = False
  if not found:
    raise ImportError(
      f"{os.fspath(path)} is on Google Cloud Storage, which needs the google-cloud-storage "
      f"library (Orbax's checkpoints and the workdir's lock use it): pip install "
      f"'{CLIENT_REQUIREMENT}', or reinstall vit_jax (pip install -e .)"
    )


NO_CREDENTIALS = (
  "no Google Cloud credentials found: on a TPU VM (or any Compute Engine VM) they come from the "
  "VM's service account (create the VM with a scope that allows Cloud Storage); on a laptop or "
  "another machine run `gcloud auth application-default login`, or set "
  "GOOGLE_APPLICATION_CREDENTIALS to a service account's key file"
)


def check_bucket(path: str | os.PathLike) -> None:
  """Raises a one-line error when `path` is on gs:// and its bucket does not exist or no
  credentials are found. Before anything is created: TensorFlow's makedirs under a missing
  bucket asks for the bucket again and again, without end.

  Raises:
    ImportError: google-cloud-storage is not installed.
    FileNotFoundError: the bucket does not exist.
    PermissionError: no credentials.
  """
  if not is_gcs(path):
    return
  require_client(path)
  from google.api_core import exceptions
  from google.auth import exceptions as auth_exceptions
  from google.cloud import storage

  bucket, _ = split(path)
  try:
    exists = storage.Client().bucket(bucket).exists()
  except auth_exceptions.DefaultCredentialsError as e:
    raise PermissionError(f"{os.fspath(path)}: {NO_CREDENTIALS}") from e
  except exceptions.Forbidden:
    return  # may not read the bucket's metadata: the object requests tell what they may do
  if not exists:
    raise FileNotFoundError(
      f"{os.fspath(path)}: the bucket gs://{bucket} does not exist (create it, e.g. `gcloud "
      f"storage buckets create gs://{bucket} --location=<the TPU's region>`, or fix the path)"
    )


def _blob(path: str | os.PathLike):
  from google.cloud import storage

  require_client(path)
  bucket, name = split(path)
  return storage.Client().bucket(bucket).blob(name)


def create_exclusive(path: str | os.PathLike, text: str) -> bool:
  """Writes `text` to the object `path` unless it exists, in one request (the precondition
  `ifGenerationMatch=0`); whether it was written. Of two processes creating the same object at
  once, exactly one gets True. Transient errors are retried (the client's policy for a request
  with a precondition): a retry of a create that had succeeded answers False, so a caller that
  gets False reads the object to see whose it is."""
  from google.api_core import exceptions

  try:
    _blob(path).upload_from_string(text, content_type="application/json", if_generation_match=0)
  except exceptions.PreconditionFailed:
    return False
  return True


def read_versioned(path: str | os.PathLike) -> tuple[str, int, float] | None:
  """(text, generation, seconds since the object was last written, by the server's clock as
  far as the local clock agrees with it) of the object `path`, or None if it does not exist.
  Bytes that are not UTF-8 are replaced (U+FFFD) in the text."""
  import datetime

  from google.api_core import exceptions
  from google.cloud import storage

  require_client(path)
  bucket, name = split(path)
  for _ in range(3):  # a write between the two requests: read again
    blob = storage.Client().bucket(bucket).get_blob(name)
    if blob is None:
      return None
    try:
      data = blob.download_as_bytes(if_generation_match=blob.generation)
    except (exceptions.PreconditionFailed, exceptions.NotFound):
      continue
    age = (datetime.datetime.now(datetime.UTC) - blob.updated).total_seconds()
    return data.decode(errors="replace"), int(blob.generation), max(0.0, age)
  return None


def replace_if(path: str | os.PathLike, text: str, generation: int) -> int | None:
  """Writes `text` to `path` only if the object is still at `generation` (one request); the new
  generation, or None when another writer (or a delete) came first."""
  from google.api_core import exceptions

  blob = _blob(path)
  try:
    blob.upload_from_string(text, content_type="application/json", if_generation_match=generation)
  except (exceptions.PreconditionFailed, exceptions.NotFound):
    return None
  return int(blob.generation)
