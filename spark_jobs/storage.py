"""Where the lake and the landing live, for everything outside Delta's own I/O: a local path or
`s3://bucket/prefix` on any S3-compatible endpoint (docs/architecture.md, "Lake on S3").

The one home of the S3 settings. They come from the AWS_* environment boto3 reads (AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION, the keys; the Airflow tasks set them from the
`aws_default` connection) and are handed on in the form each reader wants: boto3 for the lake's own
files, delta-rs' storage options, Spark's s3a settings (which Spark ships to every executor), and
pyarrow's S3 filesystem for ranged reads of landing files. Pure Python: the DAGs and the plugin import it."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from spark_jobs.settings import environ

S3_SCHEMES = ("s3://", "s3a://")


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEMES)


# Each helper reads the AWS_* variables from `env`: this process's environment, or those of an Airflow
# connection (cdc_airflow.hooks.s3_environment) in a sensor that must not change its process's environment.
KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def s3_endpoint(env: Mapping[str, str] = environ) -> str | None:
    """A non-AWS endpoint (moto, MinIO), or None for AWS itself."""
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def s3_region(env: Mapping[str, str] = environ) -> str:
    return env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"


def delta_storage_options(path: str, env: Mapping[str, str] = environ) -> dict[str, str] | None:
    """delta-rs' options for a table at `path` (None for a local one). delta-rs commits on S3 with a
    conditional put, so no lock client is needed: S3 and MinIO refuse a second writer of one version."""
    if not is_s3(path):
        return None
    options = {"AWS_REGION": s3_region(env), **{k: env[k] for k in KEY_VARIABLES if env.get(k)}}
    endpoint = s3_endpoint(env)
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        options["AWS_ALLOW_HTTP"] = str(endpoint.startswith("http://")).lower()
    return options


def hadoop_s3a_conf(with_keys: bool = True) -> dict[str, str]:
    """Hadoop settings (without the `spark.hadoop.` prefix) for Spark to read and write `s3://` paths with
    hadoop-aws' S3A filesystem. The keys go into the settings, not only the environment, because a
    cluster's executors do not share the driver's environment (Spark redacts them in its UI and logs);
    `with_keys=False` leaves them out of what goes on a command line."""
    conf = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem", "fs.s3a.endpoint.region": s3_region()}
    endpoint = s3_endpoint()
    if endpoint:
        conf |= {"fs.s3a.endpoint": endpoint, "fs.s3a.path.style.access": "true",
                 "fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https://")).lower()}
    keys = {"AWS_ACCESS_KEY_ID": "fs.s3a.access.key", "AWS_SECRET_ACCESS_KEY": "fs.s3a.secret.key",
            "AWS_SESSION_TOKEN": "fs.s3a.session.token"}
    if not with_keys:
        return conf
    conf |= {name: environ[var] for var, name in keys.items() if environ.get(var)}
    if environ.get("AWS_SESSION_TOKEN"):
        conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return conf


def s3_client() -> Any:
    """boto3's S3 client for this process's AWS_* settings. Made once per distinct settings: a client takes
    tens of milliseconds to build, and the lake's own files (a run's reports read every run's summaries)
    would otherwise build one per use; boto3 clients are safe to share between threads."""
    return _client(s3_endpoint(), s3_region(), *(environ.get(k) for k in KEY_VARIABLES))


@functools.lru_cache(maxsize=8)
def _client(endpoint: str | None, region: str, key_id: str | None, secret: str | None, token: str | None) -> Any:
    import boto3

    # explicit, not boto3's own reading of os.environ: a service job's variables are not in os.environ
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=key_id,
                        aws_secret_access_key=secret, aws_session_token=token)


def ensure_bucket(uri: str) -> bool:
    """Creates the bucket of an s3:// URI unless it exists; True when it made it. A bucket that exists but is not
    ours, or a store refusing us, is an error, not a skip."""
    client = s3_client()
    bucket = split_s3(uri)[0]
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except client.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
    client.create_bucket(Bucket=bucket)
    return True


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// or s3a:// URI."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def arrow_s3(env: Mapping[str, str] = environ) -> Any:
    """pyarrow's S3 filesystem with these settings (it takes `bucket/key` paths)."""
    from pyarrow import fs

    endpoint = s3_endpoint(env)
    parsed = urlparse(endpoint) if endpoint else None
    return fs.S3FileSystem(region=s3_region(env), endpoint_override=parsed.netloc if parsed else None,
                           scheme=parsed.scheme if parsed else "https", access_key=env.get("AWS_ACCESS_KEY_ID"),
                           secret_key=env.get("AWS_SECRET_ACCESS_KEY"), session_token=env.get("AWS_SESSION_TOKEN"))


def arrow_path(uri: str) -> str:
    return "/".join(split_s3(uri)) if is_s3(uri) else uri.removeprefix("file://")


def open_input(path: str) -> IO[bytes]:
    """A landing or lake file for reading, seekable: a Parquet footer or Avro block headers are read with
    ranged requests, not by downloading the file."""
    if not is_s3(path):
        return open(path, "rb")
    return arrow_s3().open_input_file(arrow_path(path))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Stored:
    """An object's bytes and its version tag (an S3 ETag; a local file's mtime and size)."""

    data: bytes
    tag: str


class LocalFiles:
    """The lake's own files (reports, run summaries, GX stores) on a filesystem."""

    def read(self, path: str) -> bytes | None:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, path: str, data: str | bytes) -> None:
        """Written aside, then renamed over: a reader (or a run killed mid-write) sees the old file or the
        new one, never a truncated one."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        aside = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # the service runs jobs in threads
        with open(aside, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(aside, target)

    def exists(self, path: str) -> bool:
        return Path(path).is_file()

    def list(self, prefix: str) -> list[str]:
        """Every file under the folder `prefix`, recursively, as full paths."""
        root = Path(prefix)
        return sorted(str(p) for p in root.rglob("*") if p.is_file() or p.is_symlink()) if root.is_dir() else []

    def remove(self, path: str) -> None:
        Path(path).unlink(missing_ok=True)

    def delete_tree(self, prefix: str) -> None:
        import shutil

        shutil.rmtree(prefix, ignore_errors=True)


class S3Files:
    """The same on S3: a PUT replaces an object whole, so every write is atomic as it is."""

    def __init__(self, client: Any = None):
        self.client = client or s3_client()

    def read(self, path: str) -> bytes | None:
        stored = self.get(path)
        return None if stored is None else stored.data

    def get(self, path: str) -> Stored | None:
        bucket, key = split_s3(path)
        try:
            response = self.client.get_object(Bucket=bucket, Key=key)
        except self.client.exceptions.NoSuchKey:
            return None
        return Stored(response["Body"].read(), response["ETag"])

    def write(self, path: str, data: str | bytes) -> None:
        bucket, key = split_s3(path)
        self.client.put_object(Bucket=bucket, Key=key, Body=data.encode() if isinstance(data, str) else data)

    def exists(self, path: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_s3(path)
        try:
            self.client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def list(self, prefix: str) -> list[str]:
        bucket, key = split_s3(prefix.rstrip("/") + "/")
        scheme = prefix.split("://", 1)[0]
        keys = [obj["Key"] for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
                for obj in page.get("Contents", [])]
        return sorted(f"{scheme}://{bucket}/{k}" for k in keys)

    def remove(self, path: str) -> None:
        bucket, key = split_s3(path)
        self.client.delete_object(Bucket=bucket, Key=key)

    def delete_tree(self, prefix: str) -> None:
        bucket = split_s3(prefix)[0]
        keys = [split_s3(p)[1] for p in self.list(prefix)]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes up to 1000 keys
            self.client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]],
                                                              "Quiet": True})

    # Conditional writes (S3, MinIO and moto honour If-None-Match / If-Match): the writer lock's lease
    def create(self, path: str, data: bytes) -> str | None:
        """Put `data` if nothing is at `path`; its tag, or None when something is."""
        return self._conditional(path, data, IfNoneMatch="*")

    def replace(self, path: str, data: bytes, tag: str) -> str | None:
        """Put `data` if the object is still the version `tag`; the new tag, or None when it changed."""
        return self._conditional(path, data, IfMatch=tag)

    def delete(self, path: str, tag: str) -> bool:
        """Delete the object if it is still the version `tag`; False when it changed or is gone."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(path)
        try:
            self.client.delete_object(Bucket=bucket, Key=key, IfMatch=tag)
        except ClientError as exc:  # changed, or already gone: either way no longer the version `tag`
            if _precondition_failed(exc) or exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return False
            raise
        return True

    def _conditional(self, path: str, data: bytes, **condition: str) -> str | None:
        from botocore.exceptions import ClientError

        bucket, key = split_s3(path)
        try:
            return str(self.client.put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"])
        except ClientError as exc:
            if _precondition_failed(exc):
                return None
            raise


def _precondition_failed(exc: Any) -> bool:
    # 409 ConditionalRequestConflict: a concurrent conditional write to the same key won the race
    return exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def lake_files(root: str) -> LocalFiles | S3Files:
    return S3Files() if is_s3(root) else LocalFiles()
