"""An S3-compatible server on the loopback address, for tests and benchmarks: moto's
server (``pip install 'moto[server]'``) in a thread of this process, on a free port,
counting the bytes it sends.

    with LoopbackS3() as s3:               # AWS_ENDPOINT_URL and dummy keys set meanwhile
        url = s3.put_tree("ckpt/", "run/step-100")
        ...                                # diffract analyze s3://runs/run/step-100
        s3.object_bytes                    # bytes of objects sent (GETs of a key)

The environment variables it sets are inherited by the processes started meanwhile (the
command line, pool, Dask and Ray workers), and restored when it stops."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["LoopbackS3"]

_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


class _Counting:
    """WSGI middleware: bytes of objects sent (bodies of GETs of a key), bytes of
    listings (GETs of a bucket), and every request as (method, path, range)."""

    def __init__(self, app: Any) -> None:
        self.app, self.lock = app, threading.Lock()
        self.object_bytes, self.listing_bytes, self.requests = 0, 0, []
        #: called with each request's WSGI environ before it is served (a test makes the
        #: server hostile: rewrite an object between two reads, drop the Range header,
        #: never answer)
        self.hook: Any = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if self.hook is not None:
            self.hook(environ)
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        listing = path.strip("/").count("/") == 0  # /bucket?list-type=2&prefix=...
        for chunk in self.app(environ, start_response):
            if method == "GET":
                with self.lock:
                    if listing:
                        self.listing_bytes += len(chunk)
                    else:
                        self.object_bytes += len(chunk)
            yield chunk
        with self.lock:
            self.requests.append((method, path, environ.get("HTTP_RANGE")))


class LoopbackS3:
    """The server (see the module docstring); ``bucket`` is created when it starts."""

    def __init__(self, bucket: str = "runs") -> None:
        self.bucket, self.endpoint = bucket, ""
        self._counting: _Counting | None = None
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> LoopbackS3:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # no line per request on stderr

        self._counting = _Counting(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", 0, self._counting, threaded=True,
                                   request_handler=Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._saved = {k: os.environ.get(k) for k in _ENV}
        os.environ.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID="loopback",
                          AWS_SECRET_ACCESS_KEY="loopback", AWS_DEFAULT_REGION="us-east-1")
        self.client.create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._thread.join()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # none keeps this endpoint

    @property
    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="loopback", aws_secret_access_key="loopback")

    def put_tree(self, local: str | os.PathLike[str], prefix: str) -> str:
        """Upload a file, or every file of a folder, under ``prefix``; its URL."""
        local = Path(local)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*")
                                                        if p.is_file())
        for f in files:
            key = prefix if local.is_file() else f"{prefix}/{f.relative_to(local).as_posix()}"
            self.client.upload_file(str(f), self.bucket, key)
        return f"s3://{self.bucket}/{prefix}"

    @property
    def object_bytes(self) -> int:
        return self._counting.object_bytes if self._counting else 0

    @property
    def listing_bytes(self) -> int:
        return self._counting.listing_bytes if self._counting else 0

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        if self._counting is None:
            return []
        with self._counting.lock:
            return list(self._counting.requests)

    @property
    def hook(self) -> Any:
        return self._counting.hook if self._counting else None

    @hook.setter
    def hook(self, value: Any) -> None:
        if self._counting is not None:
            self._counting.hook = value

    def reset(self) -> None:
        """Counts from zero, no hook."""
        if self._counting is not None:
            self._counting.hook = None
            with self._counting.lock:
                self._counting.object_bytes = self._counting.listing_bytes = 0
                self._counting.requests = []
