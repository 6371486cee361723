"""A real S3-compatible server on the loopback address (moto's, in a thread of the test
process), started and stopped by the tests, counting the bytes of every object it sends.

Every process a test starts (the command line, pool and Ray workers) finds the server
through ``AWS_ENDPOINT_URL`` and dummy credentials in the environment."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

BUCKET = "runs"


class Counting:
    """WSGI middleware: the bytes of objects sent (bodies of GETs of a key), the bytes of
    listings (GETs of the bucket), and every request."""

    def __init__(self, app) -> None:
        self.app, self._lock = app, threading.Lock()
        self.reset()

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        listing = path.strip("/").count("/") == 0  # /bucket?list-type=2&prefix=...
        for chunk in self.app(environ, start_response):
            if method == "GET":
                with self._lock:
                    if listing:
                        self.listed += len(chunk)
                    else:
                        self.sent += len(chunk)
            yield chunk
        with self._lock:
            self.requests.append((method, path, environ.get("HTTP_RANGE")))

    def reset(self) -> None:
        with self._lock:
            self.sent, self.listed, self.requests = 0, 0, []


class Server:
    def __init__(self, endpoint: str, counting: Counting) -> None:
        self.endpoint, self.counting = endpoint, counting

    @property
    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def put_tree(self, local: Path, prefix: str) -> str:
        """Upload a file or every file of a folder under ``prefix``; its URL."""
        local = Path(local)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*")
                                                        if p.is_file())
        for f in files:
            key = prefix if local.is_file() else f"{prefix}/{f.relative_to(local).as_posix()}"
            self.client.upload_file(str(f), BUCKET, key)
        return f"s3://{BUCKET}/{prefix}"

    def bytes_sent(self) -> int:
        return self.counting.sent


@pytest.fixture(scope="session")
def s3_server():
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    counting = Counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, counting, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    found = Server(endpoint, counting)
    found.client.create_bucket(Bucket=BUCKET)
    try:
        yield found
    finally:
        server.shutdown()
        thread.join()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3(s3_server):
    s3_server.counting.reset()
    return s3_server
