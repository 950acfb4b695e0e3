"""Party identities: a key pair and a self-signed X.509 certificate per node and driver.

A party is known by the SHA-256 fingerprint of its certificate. Cluster specs
list certificates only; a private key stays in its owner's file and is read
only to build the owner's own TLS contexts (`LocalIdentity` cannot be pickled
or serialized). Every connection is mutual TLS 1.3, each side pinned to the
one certificate the spec gives for the peer it expects.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from mplang.edsl.errors import MPLangError

if TYPE_CHECKING:
    import ssl

    from cryptography.hazmat.primitives.asymmetric import ec

DEFAULT_VALIDITY_DAYS = 365
NAME_LIMIT = 64


class IdentityError(MPLangError, ValueError):
    """A key or certificate is missing, unreadable, expired or does not match."""


@dataclass(frozen=True)
class Certificate:
    """A party's public certificate: PEM text, its SHA-256 fingerprint and validity."""

    pem: str
    fingerprint: str
    subject: str
    not_before: dt.datetime
    not_after: dt.datetime

    def expired(self, now: dt.datetime | None = None) -> bool:
        now = now or dt.datetime.now(dt.UTC)
        return not self.not_before <= now <= self.not_after

    @property
    def short(self) -> str:
        """The first 16 hex digits of the fingerprint (for messages)."""
        return self.fingerprint[:16]

    def verify(self, signature: bytes, data: bytes) -> bool:
        """Whether ``signature`` is this certificate's key's ECDSA (SHA-256) signature
        of ``data``."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        key = _public_key(self.pem)
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return False
        try:
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True


@functools.lru_cache(maxsize=1024)
def _public_key(pem: str) -> Any:
    """The public key of certificate ``pem`` (parsed once per certificate)."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.encode()).public_key()


def fingerprint_der(der: bytes) -> str:
    """The SHA-256 fingerprint (lowercase hex) of a DER-encoded certificate."""
    return hashlib.sha256(der).hexdigest()


def format_fingerprint(fingerprint: str) -> str:
    """``AB:CD:...``: the form ``openssl x509 -fingerprint -sha256`` prints."""
    return ":".join(fingerprint[i:i + 2] for i in range(0, len(fingerprint), 2)).upper()


def parse_certificate(pem: str | bytes, where: str = "certificate") -> Certificate:
    """A `Certificate` from PEM text; raises `IdentityError` naming ``where``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    data = pem.encode() if isinstance(pem, str) else pem
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise IdentityError(f"{where}: not a PEM certificate ({e})") from None
    der = cert.public_bytes(serialization.Encoding.DER)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    subject = str(names[0].value) if names else ""
    return Certificate(cert.public_bytes(serialization.Encoding.PEM).decode(),
                       fingerprint_der(der), subject, cert.not_valid_before_utc,
                       cert.not_valid_after_utc)


def load_certificate(value: str, base_dir: str | os.PathLike[str] | None = None,
                     where: str = "certificate") -> Certificate:
    """A certificate given as PEM text or as a path (relative to ``base_dir``)."""
    if "-----BEGIN CERTIFICATE-----" in value:
        return parse_certificate(value, where)
    path = Path(value)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise IdentityError(f"{where}: cannot read {path}: {e}") from None
    return parse_certificate(text, f"{where} ({path})")


def _check_name(name: str) -> None:
    if not name or len(name) > NAME_LIMIT or not all(c.isalnum() or c in "-_." for c in name):
        raise IdentityError(f"invalid identity name {name!r}: use letters, digits, '-', '_' "
                            f"and '.' (at most {NAME_LIMIT})")


def keygen(name: str, out_dir: str | os.PathLike[str], *,
           days: int = DEFAULT_VALIDITY_DAYS, overwrite: bool = False) -> Certificate:
    """Write ``out_dir/NAME.key`` (mode 0600) and ``out_dir/NAME.crt``: a new ECDSA P-256
    key and a self-signed certificate for ``name`` valid for ``days``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _check_name(name)
    if days <= 0:
        raise IdentityError("a certificate must be valid for at least one day")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = out / f"{name}.key", out / f"{name}.crt"
    if not overwrite and (key_path.exists() or cert_path.exists()):
        raise IdentityError(f"{key_path} or {cert_path} already exists (delete it first to "
                            "make a new identity)")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mplang party")])
    public = key.public_key()
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public),
                           critical=False)
            .sign(key, hashes.SHA256()))
    pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(key_path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem_key)
    os.chmod(key_path, 0o600)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path.write_bytes(cert_pem)
    return parse_certificate(cert_pem, str(cert_path))


class LocalIdentity:
    """This process's own identity: the path of its private key and its certificate.

    The key is read only into this process's TLS contexts; the object refuses to
    be pickled, copied into a spec, or printed with its key.
    """

    __slots__ = ("_signing_key", "certificate", "key_path", "name")

    def __init__(self, name: str, key_path: Path, certificate: Certificate):
        self.name = name
        self.key_path = key_path
        self.certificate = certificate
        self._signing_key: ec.EllipticCurvePrivateKey | None = None

    @property
    def fingerprint(self) -> str:
        return self.certificate.fingerprint

    def __reduce__(self) -> NoReturn:
        raise TypeError("a LocalIdentity holds a private key and never leaves its owner")

    def __repr__(self) -> str:
        return f"LocalIdentity({self.name!r}, sha256 {self.certificate.short}...)"

    def sign(self, data: bytes) -> bytes:
        """An ECDSA (SHA-256) signature of ``data`` by this identity's private key (read
        once, kept in this process like its TLS contexts' copy)."""
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        if self._signing_key is None:
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise IdentityError(f"{self.key_path} is not an elliptic-curve key")
            self._signing_key = key
        return self._signing_key.sign(data, ec.ECDSA(hashes.SHA256()))

    def server_context(self, trusted: Iterable[Certificate]) -> ssl.SSLContext:
        """A TLS 1.3 server context presenting this identity and requiring a client
        certificate among ``trusted`` (the caller maps the peer's fingerprint to a party)."""
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._configure(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
        trust(ctx, trusted)
        return ctx

    def client_context(self, peer: Certificate) -> ssl.SSLContext:
        """A TLS 1.3 client context presenting this identity that accepts exactly ``peer``."""
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._configure(ctx)
        ctx.check_hostname = False  # pinned to one certificate: names add nothing
        ctx.verify_mode = ssl.CERT_REQUIRED
        trust(ctx, [peer])
        return ctx

    def _configure(self, ctx: ssl.SSLContext) -> None:
        import ssl

        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.maximum_version = ssl.TLSVersion.TLSv1_3
        with _certificate_file(self.certificate) as cert_file:
            try:
                ctx.load_cert_chain(cert_file, self.key_path)
            except ssl.SSLError as e:
                raise IdentityError(f"{self.key_path} is not the key of certificate "
                                    f"{self.certificate.short}...: {e}") from None


def trust(ctx: ssl.SSLContext, certificates: Iterable[Certificate]) -> None:
    """Add ``certificates`` as trust anchors of ``ctx``."""
    pems = "".join(c.pem for c in certificates)
    if pems:
        ctx.load_verify_locations(cadata=pems)


class _certificate_file:
    """A private temporary file holding a certificate (``load_cert_chain`` takes paths)."""

    def __init__(self, certificate: Certificate):
        self._pem = certificate.pem

    def __enter__(self) -> str:
        import tempfile
        fd, self._path = tempfile.mkstemp(prefix="mplang-cert-", suffix=".crt")
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(self._pem)
        return self._path

    def __exit__(self, *exc: Any) -> None:
        os.unlink(self._path)


def load_identity(key_path: str | os.PathLike[str],
                  cert_path: str | os.PathLike[str] | None = None) -> LocalIdentity:
    """The identity of ``key_path``, whose certificate is ``cert_path`` (default: the same
    path with ``.crt``). Refuses a key file that others can read."""
    key = Path(key_path)
    if not key.is_file():
        raise IdentityError(f"no key file at {key} (make one with: mplang keygen --name NAME "
                            f"--out DIR)")
    _check_key_kind(key)
    mode = key.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(f"{key} can be read by other users (mode {oct(mode & 0o777)}); "
                            f"run: chmod 600 {key}")
    cert = load_certificate(str(Path(cert_path) if cert_path else key.with_suffix(".crt")),
                            where=f"certificate of {key.name}")
    if cert.expired():
        raise IdentityError(f"certificate {cert.subject} ({cert.short}...) is not valid now: "
                            f"valid {cert.not_before:%Y-%m-%d} to {cert.not_after:%Y-%m-%d}")
    identity = LocalIdentity(cert.subject or key.stem, key, cert)
    _check_pair(key, cert)
    return identity


def _check_key_kind(key: Path) -> None:
    """Refuse a file that is not a PEM private key, naming what it is."""
    head = key.read_bytes()[:1 << 16]
    if b"-----BEGIN CERTIFICATE-----" in head:
        cert = parse_certificate(head, str(key))
        sibling = key.with_suffix(".key")
        hint = f"pass {sibling}" if sibling.is_file() else "pass the .key file beside it"
        raise IdentityError(f"{key} is a certificate (of {cert.subject!r}, sha256 "
                            f"{cert.short}...), not a private key: {hint} (the key is the "
                            "file mplang keygen wrote as NAME.key)")
    if b"PRIVATE KEY-----" not in head:
        raise IdentityError(f"{key} is not a PEM private key: pass the NAME.key file that "
                            "mplang keygen or mplang init wrote")


def _check_pair(key: Path, cert: Certificate) -> None:
    """Refuse a key that does not belong to ``cert``, naming both public keys'
    fingerprints."""
    from cryptography.hazmat.primitives import serialization

    try:
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise IdentityError(f"{key} is not a readable private key: {e}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    mine = hashlib.sha256(private.public_key().public_bytes(*spki)).hexdigest()
    theirs = hashlib.sha256(_public_key(cert.pem).public_bytes(*spki)).hexdigest()
    if mine != theirs:
        raise IdentityError(
            f"{key} is not the key of certificate {key.with_suffix('.crt').name} (of "
            f"{cert.subject!r}, sha256 {cert.short}...): the key's public key has sha256 "
            f"{mine[:16]}..., the certificate's {theirs[:16]}...; pass the key and "
            "certificate that mplang keygen wrote together")


def presented_fingerprint(host: str, port: int, timeout: float = 5.0) -> str | None:
    """The fingerprint of the certificate the TLS server at ``host:port`` presents (not
    verified; None if no handshake could be made)."""
    import socket
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return fingerprint_der(der) if der else None


def peer_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The fingerprint of the certificate the peer presented in the handshake."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return fingerprint_der(der) if der else None
