"""A Hugging Face Hub on the loopback address, as much of it as huggingface_hub's
``HfFileSystem`` reads a model repository through: a revision's commit, the tree of a
folder, paths-info, and files by ``resolve`` with byte ranges. The repositories are local
folders; the bytes of files sent are counted."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos, self.sent, self.lock = repos, 0, threading.Lock()

    def _entry(self, repo: str, rel: str) -> dict[str, Any]:
        path = self.repos[repo] / rel
        if path.is_dir():
            return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(),
                    "path": rel}
        data = path.read_bytes()
        return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data),
                "path": rel}

    def _json(self, start_response: Any, value: Any, status: str = "200 OK") -> list[bytes]:
        body = json.dumps(value).encode()
        start_response(status, [("Content-Type", "application/json"),
                                ("Content-Length", str(len(body)))])
        return [body]

    def _missing(self, start_response: Any) -> list[bytes]:
        start_response("404 Not Found", [("X-Error-Code", "EntryNotFound"),
                                         ("Content-Type", "application/json")])
        return [b'{"error": "not found"}']

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        method, path = environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO", ""))
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = "/".join(parts[2:4])
            if repo not in self.repos:
                start_response("404 Not Found", [("X-Error-Code", "RepoNotFound")])
                return [b"{}"]
            kind, rest = (parts + ["revision"])[4], parts[6:]
            if kind == "revision":
                return self._json(start_response, {"id": repo, "sha": SHA, "siblings": []})
            if kind == "tree":
                folder = self.repos[repo].joinpath(*rest)
                if not folder.is_dir():
                    return self._missing(start_response)
                base = "/".join(rest)
                return self._json(start_response, [
                    self._entry(repo, f"{base}/{p.name}".lstrip("/"))
                    for p in sorted(folder.iterdir())])
            if kind == "paths-info" and method == "POST":
                size = int(environ.get("CONTENT_LENGTH") or 0)
                form = parse_qs(environ["wsgi.input"].read(size).decode())
                return self._json(start_response, [
                    self._entry(repo, p) for p in form.get("paths", [])
                    if (self.repos[repo] / p).exists()])
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rel = "/".join(parts[:2]), "/".join(parts[4:])
            file = self.repos.get(repo, Path("/nonexistent")) / rel
            if not file.is_file():
                return self._missing(start_response)
            data = file.read_bytes()
            status, headers = "200 OK", [("X-Repo-Commit", SHA),
                                         ("ETag", f'"{hashlib.sha1(data).hexdigest()}"')]
            wanted = environ.get("HTTP_RANGE")
            if wanted:
                first, _, last = wanted.removeprefix("bytes=").partition("-")
                start, stop = int(first), min(len(data), int(last) + 1 if last else len(data))
                headers.append(("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}"))
                data, status = data[start:stop], "206 Partial Content"
            headers.append(("Content-Length", str(len(data))))
            start_response(status, headers)
            if method == "HEAD":
                return [b""]
            with self.lock:
                self.sent += len(data)
            return [data]
        return self._missing(start_response)
