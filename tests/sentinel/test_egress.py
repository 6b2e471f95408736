"""The egress guard: which addresses and names it refuses in every spelling, the operators'
allowlist, that a name is resolved once and the connection goes to the address that was checked
(DNS rebinding), that TLS still verifies the original name, and that redirects and oversized
answers go no further. Real sockets on loopback addresses; DNS answers come from a resolver the
test controls (aiohttp's resolver interface), never from patching the guard."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import re
import socket
import ssl

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from sentinel import egress
from sentinel.egress import Allowlist, EgressRefused
from tests.servers import Listener

NOTHING_ALLOWED = Allowlist()

# Every way of writing an internal destination, and what the guard says about it.
REFUSED = [
    # loopback, in each spelling the system resolver accepts
    ("http://127.0.0.1/", "the host 127.0.0.1 is a loopback address 127.0.0.1"),
    ("http://2130706433/", "the host 2130706433 is a loopback address 127.0.0.1"),
    ("http://0x7f.1/", "the host 0x7f.1 is a loopback address 127.0.0.1"),
    ("http://0x7f000001/", "the host 0x7f000001 is a loopback address 127.0.0.1"),
    ("http://017700000001/", "the host 017700000001 is a loopback address 127.0.0.1"),
    ("http://0177.0.0.1/", "the host 0177.0.0.1 is a loopback address 127.0.0.1"),
    ("http://127.1/", "the host 127.1 is a loopback address 127.0.0.1"),
    ("http://127.0.0.1./", "the host 127.0.0.1 is a loopback address 127.0.0.1"),
    ("http://127.8.9.10:8080/x", "the host 127.8.9.10 is a loopback address 127.8.9.10"),
    ("http://[::1]/", "the host ::1 is a loopback address ::1"),
    # internal names
    ("http://localhost/", "localhost is an internal host name"),
    ("http://LOCALHOST./", "localhost is an internal host name"),
    ("http://api.localhost/", "api.localhost is an internal host name"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata.google.internal is an internal host name"),
    ("http://redis:6379/", "redis is an internal host name"),
    ("http://printer.local/", "printer.local is an internal host name"),
    ("http://nas.home.arpa/", "nas.home.arpa is an internal host name"),
    ("http://db.localdomain/", "db.localdomain is an internal host name"),
    # private, link-local, shared, and the rest of the special ranges
    ("http://10.0.0.5/", "the host 10.0.0.5 is a private address 10.0.0.5"),
    ("http://10.1/", "the host 10.1 is a private address 10.0.0.1"),
    ("http://0xa.0.0.5/", "the host 0xa.0.0.5 is a private address 10.0.0.5"),
    ("http://172.16.0.1/", "the host 172.16.0.1 is a private address 172.16.0.1"),
    ("http://172.31.255.255/", "the host 172.31.255.255 is a private address 172.31.255.255"),
    ("http://192.168.1.1/", "the host 192.168.1.1 is a private address 192.168.1.1"),
    ("http://169.254.169.254/latest/meta-data/", "the host 169.254.169.254 is a link-local address 169.254.169.254"),
    ("http://2852039166/", "the host 2852039166 is a link-local address 169.254.169.254"),
    ("http://100.64.0.1/", "the host 100.64.0.1 is a shared (CGNAT) address 100.64.0.1"),
    ("http://100.127.255.254/", "the host 100.127.255.254 is a shared (CGNAT) address 100.127.255.254"),
    ("http://0.0.0.0/", "the host 0.0.0.0 is an unspecified address 0.0.0.0"),
    ("http://0/", "the host 0 is an unspecified address 0.0.0.0"),
    ("http://[::]/", "the host :: is an unspecified address ::"),
    ("http://224.0.0.1/", "the host 224.0.0.1 is a multicast address 224.0.0.1"),
    ("http://239.255.255.250/", "the host 239.255.255.250 is a multicast address 239.255.255.250"),
    ("http://240.0.0.1/", "the host 240.0.0.1 is a reserved address 240.0.0.1"),
    ("http://255.255.255.255/", "the host 255.255.255.255 is a broadcast address 255.255.255.255"),
    ("http://192.0.0.8/", "the host 192.0.0.8 is a reserved address 192.0.0.8"),
    ("http://192.0.2.1/", "the host 192.0.2.1 is a documentation address 192.0.2.1"),
    ("http://198.18.0.1/", "the host 198.18.0.1 is a benchmarking address 198.18.0.1"),
    # IPv6 ranges
    ("http://[fd00::1]/", "the host fd00::1 is a private address fd00::1"),
    ("http://[fc00::1]/", "the host fc00::1 is a private address fc00::1"),
    ("http://[fe80::1]/", "the host fe80::1 is a link-local address fe80::1"),
    ("http://[fec0::1]/", "the host fec0::1 is a site-local address fec0::1"),
    ("http://[ff02::1]/", "the host ff02::1 is a multicast address ff02::1"),
    ("http://[2001:db8::1]/", "the host 2001:db8::1 is a documentation address 2001:db8::1"),
    ("http://[100::1]/", "the host 100::1 is a reserved address 100::1"),
    ("http://[64:ff9b:1::a]/", "the host 64:ff9b:1::a is a private address 64:ff9b:1::a"),
    # IPv4 inside IPv6
    ("http://[::ffff:127.0.0.1]/", "the host ::ffff:7f00:1 is an IPv4-mapped IPv6 address ::ffff:7f00:1"),
    ("http://[::ffff:7f00:1]/", "the host ::ffff:7f00:1 is an IPv4-mapped IPv6 address ::ffff:7f00:1"),
    ("http://[::ffff:169.254.169.254]/", "the host ::ffff:a9fe:a9fe is an IPv4-mapped IPv6 address ::ffff:a9fe:a9fe"),
    ("http://[::ffff:8.8.8.8]/", "the host ::ffff:808:808 is an IPv4-mapped IPv6 address ::ffff:808:808"),
    ("http://[::127.0.0.1]/", "the host ::7f00:1 is an IPv4-compatible IPv6 address ::7f00:1"),
    ("http://[::10.0.0.1]/", "the host ::a00:1 is an IPv4-compatible IPv6 address ::a00:1"),
    (
        "http://[2002:7f00:1::]/",
        "the host 2002:7f00:1:: is a 6to4 address 2002:7f00:1:: embedding a loopback address 127.0.0.1",
    ),
    (
        "http://[2002:a00:5::1]/",
        "the host 2002:a00:5::1 is a 6to4 address 2002:a00:5::1 embedding a private address 10.0.0.5",
    ),
    (
        # Teredo: the client's address is stored inverted (~10.0.0.1)
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/",
        "the host 2001:0:4136:e378:8000:63bf:f5ff:fffe is a Teredo address 2001:0:4136:e378:8000:63bf:f5ff:fffe "
        "embedding a private address 10.0.0.1",
    ),
    (
        "http://[64:ff9b::a9fe:a9fe]/",
        "the host 64:ff9b::a9fe:a9fe is a NAT64 address 64:ff9b::a9fe:a9fe embedding a link-local address "
        "169.254.169.254",
    ),
    # schemes
    ("file:///etc/passwd", "the scheme 'file' is not allowed (http or https only)"),
    ("gopher://example.com:70/_x", "the scheme 'gopher' is not allowed (http or https only)"),
    ("ftp://example.com/", "the scheme 'ftp' is not allowed (http or https only)"),
    ("http:///path-only", "the URL names no host"),
]


@pytest.mark.parametrize(("url", "reason"), REFUSED)
def test_the_guard_refuses_internal_destinations_in_every_spelling(url, reason):
    with pytest.raises(EgressRefused) as refused:
        egress.target(url, NOTHING_ALLOWED)
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("url", "connects_to"),
    [
        ("https://hooks.example.com/sentinel", None),
        ("https://8.8.8.8/", "8.8.8.8"),
        ("https://134744072/", "8.8.8.8"),  # a decimal spelling of a public address: read, then used as read
        ("https://0x8.0x8.0x8.0x8/", "8.8.8.8"),
        ("https://[2606:4700:4700::1111]/", "2606:4700:4700::1111"),
        ("https://[2002:808:808::1]/", "2002:808:808::1"),  # 6to4 of a public address
        ("https://[64:ff9b::808:808]/", "64:ff9b::808:808"),  # NAT64 of a public address
    ],
)
def test_public_destinations_pass_and_a_numeric_spelling_is_connected_to_as_read(url, connects_to):
    found = egress.target(url, NOTHING_ALLOWED)
    assert found.address == (ipaddress.ip_address(connects_to) if connects_to else None)
    assert found.url.host == (connects_to or "hooks.example.com")


def test_the_allowlist_admits_its_networks_and_names_only():
    allow = Allowlist.parse(["10.20.0.0/16", "127.0.0.1", "fd00:1::/32", "Guardrail.Corp.", "guard"])
    assert allow.networks == (
        ipaddress.ip_network("10.20.0.0/16"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("fd00:1::/32"),
    )
    assert allow.hosts == frozenset({"guardrail.corp", "guard"})
    for url in (
        "http://10.20.3.4/",
        "http://127.0.0.1:9000/",
        "http://[fd00:1::5]/",
        "http://guard/",
        "http://GUARD./",
    ):
        egress.target(url, allow)  # no refusal
    for url, reason in [
        ("http://10.21.0.1/", "the host 10.21.0.1 is a private address 10.21.0.1"),
        ("http://127.0.0.2/", "the host 127.0.0.2 is a loopback address 127.0.0.2"),
        ("http://[::1]/", "the host ::1 is a loopback address ::1"),
        ("http://[::ffff:127.0.0.1]/", "the host ::ffff:7f00:1 is an IPv4-mapped IPv6 address ::ffff:7f00:1"),
        ("http://localhost/", "localhost is an internal host name"),
        ("http://other/", "other is an internal host name"),
    ]:
        with pytest.raises(EgressRefused) as refused:
            egress.target(url, allow)
        assert refused.value.reason == reason
    egress.check_resolved("guardrail.corp", ["10.9.9.9"], allow)  # an allowed name may resolve anywhere
    with pytest.raises(EgressRefused, match=re.escape("x.example resolves to a private address 10.9.9.9")):
        egress.check_resolved("x.example", ["10.9.9.9"], allow)


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "not a host", "127.1", "0x7f.1", "http://x.example", "a..b"])
def test_a_bad_allowlist_entry_fails_loudly(entry):
    with pytest.raises(ValueError, match=rf"SENTINEL_EGRESS_ALLOW: '{entry}' is neither a CIDR"):
        Allowlist.parse([entry])


def test_the_save_time_check_resolves_names_and_names_the_address():
    answers = {"hooks.example.com": ["93.184.215.14"], "intranet.example.com": ["93.184.215.14", "10.0.0.5"]}

    def resolve(host, port):
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    egress.check_url("https://hooks.example.com/x", NOTHING_ALLOWED, resolve)
    egress.check_url("https://not-yet.example.com/x", NOTHING_ALLOWED, resolve)  # checked again on every call
    with pytest.raises(EgressRefused) as refused:
        egress.check_url("https://intranet.example.com/x", NOTHING_ALLOWED, resolve)
    assert refused.value.reason == "intranet.example.com resolves to a private address 10.0.0.5"
    with pytest.raises(EgressRefused, match=re.escape("the host 169.254.169.254 is a link-local")):
        egress.check_url("http://169.254.169.254/", NOTHING_ALLOWED, resolve)


# --- connections ---------------------------------------------------------------------------------


class ScriptedResolver(AbstractResolver):
    """A DNS server the test controls: each question gets the next answer (the last one repeats)."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.questions: list[str] = []

    async def resolve(self, host, port=0, family=socket.AF_INET) -> list[ResolveResult]:
        self.questions.append(host)
        addresses = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [
            ResolveResult(hostname=host, host=address, port=port, family=socket.AF_INET, proto=0, flags=0)
            for address in addresses
        ]

    async def close(self) -> None:
        pass


def send(url: str, resolver: AbstractResolver | None = None, ssl_context=None, **options) -> egress.Reply:
    async def run() -> egress.Reply:
        async with egress.new_session(resolver, ssl_context) as session:
            return await egress.post(
                url,
                data=b'{"hello": 1}',
                headers={"content-type": "application/json"},
                timeout=5,
                session=session,
                **options,
            )

    return asyncio.run(run())


def listeners_on_one_port(**answer) -> tuple[Listener, Listener]:
    """Two listeners on the same port: 127.0.0.2 plays a public host, 127.0.0.3 an internal one."""
    for _ in range(20):
        public = Listener("127.0.0.2", **answer)
        try:
            return public, Listener("127.0.0.3", public.port)
        except OSError:
            public.close()
    raise RuntimeError("no port free on both 127.0.0.2 and 127.0.0.3")


@pytest.fixture
def public_and_internal(settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["127.0.0.2"])
    public, internal = listeners_on_one_port()
    yield public, internal
    public.close()
    internal.close()


def test_a_name_is_resolved_once_and_the_connection_goes_to_the_checked_address(public_and_internal):
    public, internal = public_and_internal
    dns = ScriptedResolver(["127.0.0.2"], ["127.0.0.3"])  # a rebinding server: public first, then internal

    reply = send(public.url("/hook", host="rebind.example"), dns)

    assert (reply.status, reply.body) == (200, b'{"action": "allow"}')
    assert dns.questions == ["rebind.example"]
    assert [(path, headers["host"], body) for path, headers, body in public.requests] == [
        ("/hook", f"rebind.example:{public.port}", b'{"hello": 1}')
    ]
    assert internal.connections == 0


def test_a_name_that_resolves_internal_is_refused_before_any_connection(public_and_internal):
    public, internal = public_and_internal
    dns = ScriptedResolver(["127.0.0.3"], ["127.0.0.2"])  # internal first: no second question may undo it

    with pytest.raises(EgressRefused) as refused:
        send(public.url("/hook", host="rebind.example"), dns)

    assert refused.value.reason == "rebind.example resolves to a loopback address 127.0.0.3"
    assert dns.questions == ["rebind.example"]
    assert (public.connections, internal.connections) == (0, 0)


def test_one_internal_answer_among_public_ones_refuses_the_name(public_and_internal):
    public, internal = public_and_internal
    with pytest.raises(EgressRefused, match=re.escape("mixed.example resolves to a loopback address 127.0.0.3")):
        send(public.url("/", host="mixed.example"), ScriptedResolver(["127.0.0.2", "127.0.0.3"]))
    assert (public.connections, internal.connections) == (0, 0)


def test_a_redirect_is_the_answer_and_is_not_followed(settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["127.0.0.2"])
    internal = Listener("127.0.0.3")
    public = Listener("127.0.0.2", status=307, headers={"location": internal.url("/steal")})
    try:
        reply = send(public.url("/hook"))
        assert reply.status == 307
        assert len(public.requests) == 1
        assert internal.connections == 0
    finally:
        public.close()
        internal.close()


def test_an_oversized_answer_is_cut_off(settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["127.0.0.2"])
    public = Listener("127.0.0.2", body=b"x" * 300_000)
    try:
        with pytest.raises(egress.ResponseTooLarge, match="over 100000 bytes"):
            send(public.url("/"), max_bytes=100_000)
        assert send(public.url("/"), max_bytes=300_000).body == b"x" * 300_000
    finally:
        public.close()


@pytest.fixture
def loopback_listeners(settings):
    """Listeners on 127.0.0.1 and [::1], on one port, with nothing allowed."""
    settings.EGRESS_ALLOW = NOTHING_ALLOWED
    for _ in range(20):
        v4 = Listener("127.0.0.1")
        try:
            v6 = Listener("::1", v4.port)
            break
        except OSError:
            v4.close()
    yield v4, v6
    v4.close()
    v6.close()


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "2130706433",
        "0x7f.1",
        "017700000001",
        "127.1",
        "localhost",
        "LOCALHOST.",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::127.0.0.1]",
        "[2002:7f00:1::]",
    ],
)
def test_no_spelling_of_loopback_reaches_a_listener_there(loopback_listeners, host):
    v4, v6 = loopback_listeners
    with pytest.raises(EgressRefused):
        send(v4.url("/", host=host))
    assert (v4.connections, v6.connections) == (0, 0)


def test_an_allowed_loopback_listener_is_reached(settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["127.0.0.1"])
    listener = Listener("127.0.0.1")
    try:
        assert send(listener.url("/ok")).status == 200
        assert (listener.connections, [path for path, _, _ in listener.requests]) == (1, ["/ok"])
    finally:
        listener.close()


def test_the_resolver_reads_numeric_names_itself_and_asks_dns_nothing(settings):
    settings.EGRESS_ALLOW = NOTHING_ALLOWED
    dns = ScriptedResolver(["93.184.215.14"])

    async def ask(host):
        return await egress.GuardedResolver(dns).resolve(host, 80)

    with pytest.raises(EgressRefused, match=re.escape("the host 0x7f.1 is a loopback address 127.0.0.1")):
        asyncio.run(ask("0x7f.1"))
    with pytest.raises(EgressRefused, match="instance-data is an internal host name"):
        asyncio.run(ask("instance-data"))
    assert dns.questions == []
    assert [r["host"] for r in asyncio.run(ask("hooks.example.com"))] == ["93.184.215.14"]
    assert dns.questions == ["hooks.example.com"]


# --- TLS: the connection goes to the checked address, the certificate is checked for the name --------


def certificates(name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A throwaway CA and a server certificate for `name`: (server context, client context)."""
    import tempfile

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, public_key, signing_key, *, ca: bool, san: str | None = None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = build("test CA", "test CA", ca_key.public_key(), ca_key, ca=True)
    leaf = build(name, "test CA", leaf_key.public_key(), ca_key, ca=False, san=name)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.NamedTemporaryFile("wb") as cert, tempfile.NamedTemporaryFile("wb") as key:
        cert.write(leaf.public_bytes(serialization.Encoding.PEM))
        key.write(
            leaf_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        cert.flush()
        key.flush()
        server.load_cert_chain(cert.name, key.name)
    client = ssl.create_default_context(cadata=ca.public_bytes(serialization.Encoding.PEM).decode())
    return server, client


def test_tls_goes_to_the_checked_address_and_verifies_the_original_name(settings):
    settings.EGRESS_ALLOW = Allowlist.parse(["127.0.0.2"])
    server_context, client_context = certificates("guard.example")
    names: list[str | None] = []
    server_context.sni_callback = lambda sock, name, context: names.append(name)
    listener = Listener("127.0.0.2", tls=server_context)
    try:
        dns = ScriptedResolver(["127.0.0.2"])
        reply = send(listener.url("/check", host="guard.example"), dns, client_context)
        assert reply.status == 200
        assert names == ["guard.example"]
        assert listener.requests[0][1]["host"] == f"guard.example:{listener.port}"

        # The same address under a name the certificate is not for: refused by TLS verification.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            send(listener.url("/check", host="other.example"), ScriptedResolver(["127.0.0.2"]), client_context)
        assert len(listener.requests) == 1
    finally:
        listener.close()
