"""HTTP tool services behind TLS: a manifest tool's `https://` URL is called over TLS with the
server's certificate and host name verified against the system's store, or against the CA file
the tool names (`ca_file`, relative to the manifest). A failed verification answers the call
`service_unavailable` saying why. The server here is the standard library's HTTP server wrapped
in the standard library's TLS, with a CA and server certificates made by the test."""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import scaled, serve
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from python_support import call, write_pack
from test_services import Recorder, make_handler  # the same service, behind TLS here


def _name(text: str) -> Any:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _pem_key(key: Any) -> bytes:
    pem: bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())
    return pem


class Pki:
    """A CA, and server certificates it signs, written to `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        ca = _name("machina test CA")
        self.cert = (x509.CertificateBuilder().subject_name(ca).issuer_name(ca)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_file = folder / "ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def server(self, label: str, dns: list[str], ips: list[str]) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        cert = (x509.CertificateBuilder().subject_name(_name(label)).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_file, key_file = self.folder / f"{label}.pem", self.folder / f"{label}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        return cert_file, key_file


class TlsService:
    def __init__(self, cert: tuple[Path, Path], idle_timeout: float | None = None) -> None:
        self.rec = Recorder()
        handler = make_handler(self.rec)
        handler.timeout = idle_timeout  # a kept-alive connection idle this long is closed
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*cert)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    folder = tmp_path / "pki"
    folder.mkdir()
    return Pki(folder)


@pytest.fixture
def service(pki: Pki) -> Iterator[TlsService]:
    s = TlsService(pki.server("local", ["localhost"], ["127.0.0.1"]))
    yield s
    s.close()


def tls_tool(aid: str, url: str, **fields: Any) -> dict[str, Any]:
    return {"aid": aid, "runner": "service", "url": url, **fields}


def test_an_https_service_is_called_with_the_manifests_ca_over_one_kept_alive_connection(
        tmp_path: Path, pki: Pki, service: TlsService) -> None:
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "certs").mkdir()
    (pack / "certs" / "ca.pem").write_bytes(pki.ca_file.read_bytes())
    tools = [tls_tool("AID.TLS.SUM.v1", f"https://localhost:{service.port}/run", name="summer",
                      ca_file="certs/ca.pem", token_env="TLS_TOKEN", guarantees={"no_network": True}),
             tls_tool("AID.TLS.IP.v1", f"https://127.0.0.1:{service.port}/run", ca_file=str(pki.ca_file))]
    manifest = write_pack(pack, tools)
    r = serve([call("AID.TLS.SUM.v1", {"a": 1, "b": i}) for i in range(3)] + [call("AID.TLS.IP.v1", {"a": 2, "b": 2})],
              "--tools", str(manifest), env={"TLS_TOKEN": "s3cret"})
    assert [x["ok"] for x in r] == [True] * 4, r
    assert [json.loads(x["output_json"]) for x in r] == [{"sum": 1}, {"sum": 2}, {"sum": 3}, {"sum": 4}]
    # The handshake went over TLS too, once; the token as for http.
    paths = [p for p, _, _ in service.rec.requests]
    assert paths == ["/capabilities/handshake", "/run", "/run", "/run", "/run"]
    assert all(h["Authorization"] == "Bearer s3cret" for p, _, h in service.rec.requests[:4])
    assert "Authorization" not in service.rec.requests[4][2]
    assert r[0]["trace"]["service_handshake"] == "ok" and r[0]["trace"]["service_version"] == "stdlib-1"
    # One connection per origin (localhost, 127.0.0.1), kept alive across the calls.
    assert service.rec.connections == 2


def test_the_in_process_host_speaks_https_too(tmp_path: Path, pki: Pki, service: TlsService) -> None:
    manifest = write_pack(tmp_path / "pack", [tls_tool("AID.TLS.SUM.v1", f"https://localhost:{service.port}/run",
                                                       ca_file=str(pki.ca_file))])
    with md.InProcess(tools=[str(manifest)]) as host:
        r = host.call("AID.TLS.SUM.v1", {"a": 20, "b": 22})
        assert r.ok and json.loads(r.output_json) == {"sum": 42}, r
    assert [p for p, _, _ in service.rec.requests] == ["/run"]


def test_a_certificate_no_trusted_ca_signed_is_refused(tmp_path: Path, service: TlsService) -> None:
    # Without ca_file the system's store is used, and it does not hold the test's CA.
    tools = [tls_tool("AID.TLS.SUM.v1", f"https://localhost:{service.port}/run")]
    [r] = serve([call("AID.TLS.SUM.v1", {"a": 1, "b": 1})], "--tools", str(write_pack(tmp_path / "p", tools)))
    assert r["code"] == "service_unavailable", r
    assert "certificate verify failed" in r["error"] and "issuer" in r["error"], r["error"]
    assert service.rec.requests == []


def test_the_system_store_is_the_one_openssl_programs_use(tmp_path: Path, pki: Pki, service: TlsService) -> None:
    # SSL_CERT_FILE names the store, for the host as for Python's ssl and curl.
    tools = [tls_tool("AID.TLS.SUM.v1", f"https://localhost:{service.port}/run")]
    [r] = serve([call("AID.TLS.SUM.v1", {"a": 1, "b": 1})], "--tools", str(write_pack(tmp_path / "p", tools)),
                env={"SSL_CERT_FILE": str(pki.ca_file)})
    assert r["ok"] and json.loads(r["output_json"]) == {"sum": 2}, r


def test_a_certificate_for_another_name_is_refused(tmp_path: Path, pki: Pki) -> None:
    other = TlsService(pki.server("other", ["other.example"], ["192.0.2.7"]))
    try:
        tools = [tls_tool("AID.TLS.NAME.v1", f"https://localhost:{other.port}/run", ca_file=str(pki.ca_file)),
                 tls_tool("AID.TLS.ADDR.v1", f"https://127.0.0.1:{other.port}/run", ca_file=str(pki.ca_file))]
        r = serve([call("AID.TLS.NAME.v1", {"a": 1, "b": 1}), call("AID.TLS.ADDR.v1", {"a": 1, "b": 1})],
                  "--tools", str(write_pack(tmp_path / "p", tools)), "--breaker-threshold", "100")
        for x, name in zip(r, ["localhost", "127.0.0.1"], strict=True):
            assert x["code"] == "service_unavailable", x
            assert "certificate verify failed" in x["error"] and f"not for {name}" in x["error"], x["error"]
        assert other.rec.requests == []
    finally:
        other.close()


def test_an_https_answer_is_capped_as_over_http(tmp_path: Path, pki: Pki, service: TlsService) -> None:
    tools = [tls_tool("AID.TLS.SUM.v1", f"https://127.0.0.1:{service.port}/run", ca_file=str(pki.ca_file))]
    r = serve([call("AID.TLS.SUM.v1", {"how": "huge"}), call("AID.TLS.SUM.v1", {"a": 1, "b": 2})],
              "--tools", str(write_pack(tmp_path / "p", tools)))
    assert r[0]["code"] == "output_too_large", r[0]
    assert r[1]["ok"] and json.loads(r[1]["output_json"]) == {"sum": 3}


def test_a_self_signed_certificate_named_as_the_ca_file_is_trusted(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name("self")).issuer_name(_name("self"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "self.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "self.key").write_bytes(_pem_key(key))
    s = TlsService((tmp_path / "self.pem", tmp_path / "self.key"))
    try:
        tools = [tls_tool("AID.TLS.SUM.v1", f"https://127.0.0.1:{s.port}/run", ca_file=str(tmp_path / "self.pem"))]
        [r] = serve([call("AID.TLS.SUM.v1", {"a": 3, "b": 4})], "--tools", str(write_pack(tmp_path / "p", tools)))
        assert r["ok"] and json.loads(r["output_json"]) == {"sum": 7}, r
    finally:
        s.close()


def test_a_connection_the_server_closed_while_idle_is_replaced(tmp_path: Path, pki: Pki) -> None:
    s = TlsService(pki.server("local", ["localhost"], ["127.0.0.1"]), idle_timeout=0.3)
    try:
        tools = [tls_tool("AID.TLS.SUM.v1", f"https://127.0.0.1:{s.port}/run", ca_file=str(pki.ca_file))]
        manifest = write_pack(tmp_path / "p", tools)
        with md.InProcess(tools=[str(manifest)]) as host:
            first = host.call("AID.TLS.SUM.v1", {"a": 1, "b": 1})
            time.sleep(0.8)  # the server ends the TLS session and closes the connection
            second = host.call("AID.TLS.SUM.v1", {"a": 2, "b": 2})
        assert first.ok and second.ok and json.loads(second.output_json) == {"sum": 4}, second
        assert s.rec.connections == 2 and len(s.rec.requests) == 2
    finally:
        s.close()


def test_the_deadline_covers_the_tls_handshake(tmp_path: Path, pki: Pki) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, and never says a word
    try:
        tools = [tls_tool("AID.TLS.MUTE.v1", f"https://127.0.0.1:{silent.getsockname()[1]}/run",
                          ca_file=str(pki.ca_file))]
        t0 = time.monotonic()
        [r] = serve([call("AID.TLS.MUTE.v1", {}, timeout_ms=400)], "--tools", str(write_pack(tmp_path / "p", tools)))
        assert r["code"] == "timeout", r
        assert time.monotonic() - t0 < scaled(5)
    finally:
        silent.close()


@pytest.mark.parametrize(("tool", "expected"), [
    (tls_tool("AID.S.v1", "https://127.0.0.1:1/run", ca_file="missing.pem"),
     r"field 'ca_file': cannot load the CA file .*missing\.pem"),
    (tls_tool("AID.S.v1", "http://127.0.0.1:1/run", ca_file="ca.pem"),
     r"field 'ca_file': only an https:// URL has certificates to verify"),
    (tls_tool("AID.S.v1", "https://127.0.0.1:1/run", ca_file=""), r"field 'ca_file': must not hold an empty path"),
])
def test_a_bad_ca_file_is_refused_with_the_manifest(tmp_path: Path, tool: dict[str, Any], expected: str) -> None:
    manifest = write_pack(tmp_path / "bad", [tool])
    with pytest.raises(md.HostError, match=expected):
        md.InProcess(tools=[str(manifest)])
    with pytest.raises(AssertionError, match=re.escape("ca_file")):
        serve([], "--tools", str(manifest))
