"""PyTorch's CPU index, served on 127.0.0.1 from wheels already on this machine.

The action installs torch with ``uv pip install --torch-backend cpu``, and uv sends that request
to https://download.pytorch.org/whl/cpu, a URL compiled into it (crates/uv-torch in
astral-sh/uv). That host is out of reach here, so the local workflow run gives the job an HTTPS
proxy (``HTTPS_PROXY``) that answers for download.pytorch.org alone, with a certificate from a
certificate authority made for the run and added to the job's ``SSL_CERT_FILE``. Every other
host is left out of the proxy (``NO_PROXY``) and reached as usual; a CONNECT to any other host
is refused, so a request the job was not expected to make fails loudly.

What the index lists is what pip's ``find-links`` directories hold (the machine's own CPU
wheels): a job whose Python or torch has no wheel there is skipped up front, saying so.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dcp_invariant.wheels import file_sha256

HOST = "download.pytorch.org"
CPU_PREFIX = "/whl/cpu/"
OPENSSL_TIMEOUT = 60
# Registries the jobs reach directly: PyPI's pages and files.
DIRECT_HOSTS = ("pypi.org", "files.pythonhosted.org")


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str  # e.g. 2.13.0+cpu
    python_tag: str  # e.g. cp311

    @property
    def name(self) -> str:
        return self.path.name


def local_wheels() -> list[Wheel]:
    """torch CPU wheels in pip's find-links directories (``pip config list``)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    directories = []
    for line in listed.splitlines():
        if re.match(r"[^=]*find-links=", line):
            directories += line.split("=", 1)[1].strip("'\"").split()
    wheels = []
    for directory in dict.fromkeys(directories):
        for path in sorted(Path(directory).glob("torch-*+cpu-*.whl")):
            _, version, python_tag, *_ = path.name.split("-")
            wheels.append(Wheel(path, version, python_tag))
    return wheels


def has_wheel(torch_version: str, python: str) -> bool:
    """Whether the index can serve ``torch==torch_version`` to CPython ``python`` (``3.11``)."""
    tag = "cp" + python.replace(".", "")
    return any(w.version == f"{torch_version}+cpu" and w.python_tag == tag for w in local_wheels())


@dataclass(frozen=True)
class Served:
    proxy: str  # http://127.0.0.1:PORT
    ca_bundle: Path  # the machine's authorities and the run's own

    def environment(self) -> dict[str, str]:
        """What a job needs to reach the index through the proxy, and everything else directly."""
        direct = ",".join([*DIRECT_HOSTS, "127.0.0.1", "localhost"])
        return {
            "HTTPS_PROXY": self.proxy,
            "https_proxy": self.proxy,
            "NO_PROXY": direct,
            "no_proxy": direct,
            "SSL_CERT_FILE": str(self.ca_bundle),
        }


@contextmanager
def serve(directory: Path) -> Iterator[Served]:
    """Serve the index until the block ends; ``directory`` holds its keys and certificates."""
    directory.mkdir(parents=True, exist_ok=True)
    context = _server_context(directory)
    wheels = {w.name: w for w in local_wheels()}
    digests = {name: file_sha256(w.path) for name, w in wheels.items()}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # a job's output is its own; refusals are answered, not logged

        def do_CONNECT(self) -> None:
            host, _, port = self.path.partition(":")
            if host != HOST or port != "443":
                self.send_error(403, f"the local index serves {HOST} only, not {self.path}")
                return
            self.send_response(200, "Connection established")
            self.end_headers()
            self.close_connection = True
            with context.wrap_socket(self.connection, server_side=True) as tls:
                Index(tls, self.client_address, self.server, wheels, digests)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield Served(f"http://127.0.0.1:{port}", directory / "ca-bundle.pem")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Index(BaseHTTPRequestHandler):
    """download.pytorch.org's simple pages and files, for the wheels given."""

    protocol_version = "HTTP/1.1"

    def __init__(
        self,
        request: socket.socket,
        client: tuple[str, int],
        server: socketserver.BaseServer,
        wheels: dict[str, Wheel],
        digests: dict[str, str],
    ) -> None:
        self.wheels = wheels
        self.digests = digests
        super().__init__(request, client, server)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path == f"{CPU_PREFIX}torch/":
            links = "".join(
                f'<a href="{CPU_PREFIX}{urllib.parse.quote(name)}#sha256={self.digests[name]}">'
                f"{html.escape(name)}</a>\n"
                for name in sorted(self.wheels)
            )
            self._send(200, "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        elif path.startswith(CPU_PREFIX) and path[len(CPU_PREFIX) :] in self.wheels:
            wheel = self.wheels[path[len(CPU_PREFIX) :]]
            size = wheel.path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(wheel.path, "rb") as f:
                shutil.copyfileobj(f, self.wfile)
        elif path.startswith(CPU_PREFIX) and path.endswith("/"):
            # Another PyTorch package (torchvision, triton, ...): none is served here.
            self._send(404, "text/plain", "not on this machine\n")
        else:
            self._send(404, "text/plain", "not found\n")

    def do_HEAD(self) -> None:
        self._send(405, "text/plain", "")

    def _send(self, status: int, kind: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _server_context(directory: Path) -> ssl.SSLContext:
    """A certificate authority for this run, a certificate for HOST it signed, and a bundle of
    the machine's authorities plus this one for the job's TLS clients."""

    def openssl(*args: str) -> None:
        subprocess.run(
            ["openssl", *args],
            cwd=directory,
            capture_output=True,
            timeout=OPENSSL_TIMEOUT,
            check=True,
        )

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=dcp-invariant local run CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "host.key", "-out", "host.csr",
        "-subj", f"/CN={HOST}",
    )  # fmt: skip
    (directory / "host.ext").write_text(
        f"subjectAltName=DNS:{HOST}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "host.pem", "-extfile", "host.ext",
    )  # fmt: skip
    machine = ssl.get_default_verify_paths().cafile or os.environ.get("SSL_CERT_FILE", "")
    bundle = Path(machine).read_bytes() if machine and Path(machine).is_file() else b""
    (directory / "ca-bundle.pem").write_bytes(bundle + b"\n" + (directory / "ca.pem").read_bytes())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "host.pem", directory / "host.key")
    context.set_alpn_protocols(["http/1.1"])
    return context
