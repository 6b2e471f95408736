"""The egress guard: every request Sentinel sends to a URL a tenant admin set (webhook endpoints, the
screening guardrail) goes through here, so a tenant's settings never reach Sentinel's own network.
What it refuses, and the operators' allowlist for deliberate internal targets: docs/egress.md.
Provider API bases are the operators' alone and do not come here.

How it holds: a URL's host is first read as the system resolver would read it (`2130706433`,
`0x7f.1`, `017700000001` and `127.1` are all 127.0.0.1) and checked; a name is resolved exactly
once, by the aiohttp connector's resolver (GuardedResolver), which checks every address it got and
hands the connector those addresses and no others. The connector connects to them (TLS verification,
SNI and the Host header keep the original name), so a DNS server that answers differently a moment
later is never asked again. No redirect is followed; answers are capped in size and in time.

Written by hand on `ipaddress` and aiohttp's resolver interface, because no maintained library fits:
advocate (unmaintained since 2020) and microsoft-antissrf wrap `requests`; httpx-secure (async httpx
only) patches httpx's private transport internals and, by its own documentation, opens TCP probes
to denied addresses while choosing one; drawbridge is an alpha httpx wrapper. The gateway's HTTP
client is aiohttp, whose connector already connects to exactly what its resolver returns.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import settings
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = frozenset({"http", "https"})
MAX_RESPONSE_BYTES = 1024 * 1024
ALLOW_VARIABLE = "SENTINEL_EGRESS_ALLOW"


class EgressRefused(Exception):
    """The guard will not send this request. The reason names the destination's problem (never
    anything a target answered: there was no answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ResponseTooLarge(Exception):
    """The answer went past the size cap; the rest was not read."""


# --- what counts as internal ---------------------------------------------------------------------

# First match wins. Anything else that Python does not call globally reachable is "reserved".
_V4_KINDS = [
    (ipaddress.ip_network(network), kind)
    for network, kind in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (CGNAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "documentation"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    )
]
_V6_KINDS = [
    (ipaddress.ip_network(network), kind)
    for network, kind in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::ffff:0:0/96", "IPv4-mapped IPv6"),
        ("::/96", "IPv4-compatible IPv6"),
        ("64:ff9b:1::/48", "private"),  # local-use NAT64
        ("100::/64", "reserved"),  # discard-only
        ("2001:db8::/32", "documentation"),
        ("fc00::/7", "private"),  # unique local
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Names that only ever mean something inside a network: single labels (`redis`, `metadata`),
# localhost (RFC 6761), mDNS (RFC 6762), the private-use TLD and the home network zone.
_INTERNAL_SUFFIXES = (".localhost", ".local", ".localdomain", ".internal", ".home.arpa")
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
_NUMERIC = re.compile(r"[0-9][0-9a-fA-FxX.]*")


def _a(kind: str) -> str:
    return ("an " if kind[0].lower() in "aeiou" else "a ") + kind


def describe(address: IPAddress) -> str | None:
    """Why an address is internal, as a phrase ("a private address 10.0.0.5"); None when it is public.
    Addresses that embed an IPv4 address (6to4, Teredo, NAT64) are judged by it as well."""
    table = _V4_KINDS if address.version == 4 else _V6_KINDS
    for network, kind in table:
        if address in network:
            return f"{_a(kind)} address {address}"
    if address.version == 6:
        embedded = []
        if address in _NAT64:
            embedded.append(("NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)))
        if address.sixtofour is not None:
            embedded.append(("6to4", address.sixtofour))
        if address.teredo is not None:
            server, client = address.teredo
            embedded += [("Teredo", client), ("Teredo", server)]
        for kind, inner in embedded:
            problem = describe(inner)
            if problem:
                return f"{_a(kind)} address {address} embedding {problem}"
    if not address.is_global:
        return f"a reserved address {address}"
    return None


def numeric_address(host: str) -> IPAddress | None:
    """The address a host is, in whatever spelling the system resolver accepts: IPv6 literals, and
    IPv4 as inet_aton reads it (decimal `2130706433`, hex `0x7f.1`, octal `017700000001`, short
    `127.1`). None for a name."""
    host = host.rstrip(".")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not _NUMERIC.fullmatch(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def internal_name(host: str) -> bool:
    return "." not in host or host == "localhost" or host.endswith(_INTERNAL_SUFFIXES)


# --- the operators' allowlist --------------------------------------------------------------------


@dataclass(frozen=True)
class Allowlist:
    """Deliberate internal targets (SENTINEL_EGRESS_ALLOW): addresses in these networks, and these
    host names whatever they resolve to."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        networks, hosts = [], set()
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            host = entry.lower().rstrip(".")
            if not _HOST_NAME.fullmatch(host) or numeric_address(host) is not None:
                raise ValueError(
                    f"{ALLOW_VARIABLE}: {entry!r} is neither a CIDR (10.0.0.0/8, 127.0.0.1) nor a host name"
                )
            hosts.add(host)
        return cls(tuple(networks), frozenset(hosts))

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)

    def allows_host(self, host: str) -> bool:
        return host in self.hosts


def allowlist() -> Allowlist:
    return settings.EGRESS_ALLOW


def refusal(address: IPAddress, allow: Allowlist) -> str | None:
    """Why the guard refuses to connect to this address, None when it may."""
    return None if allow.allows_address(address) else describe(address)


# --- checks: at save time and before every request -----------------------------------------------


@dataclass(frozen=True)
class Target:
    url: URL  # a numeric host rewritten to the address it spells
    host: str  # lower case, without the trailing dot
    address: IPAddress | None  # when the host is an address


def target(url: str, allow: Allowlist | None = None) -> Target:
    """Parse a URL and refuse what needs no DNS to refuse: another scheme, an internal address in
    any spelling, an internal host name."""
    allow = allow if allow is not None else allowlist()
    try:
        parsed = URL(url)
    except (TypeError, ValueError):
        raise EgressRefused("the URL cannot be parsed") from None
    if parsed.scheme not in SCHEMES:
        raise EgressRefused(f"the scheme {parsed.scheme!r} is not allowed (http or https only)")
    host = (parsed.host or "").lower().rstrip(".")
    if not host:
        raise EgressRefused("the URL names no host")
    address = numeric_address(host)
    if address is not None:
        problem = refusal(address, allow)
        if problem:
            raise EgressRefused(f"the host {host} is {problem}")
        if address.version == 4 and parsed.host != str(address):
            parsed = parsed.with_host(str(address))  # connect to what was checked, not a spelling
        return Target(parsed, host, address)
    if internal_name(host) and not allow.allows_host(host):
        raise EgressRefused(f"{host} is an internal host name")
    return Target(parsed, host, None)


def check_resolved(host: str, addresses: Iterable[str], allow: Allowlist) -> None:
    """Every address a name resolved to must be allowed: one internal answer refuses the name."""
    if allow.allows_host(host):
        return
    for text in addresses:
        problem = refusal(ipaddress.ip_address(text), allow)
        if problem:
            raise EgressRefused(f"{host} resolves to {problem}")


def getaddrinfo(host: str, port: int | None) -> list[str]:
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def check_url(url: str, allow: Allowlist | None = None, resolve: Callable = getaddrinfo) -> None:
    """The save-time check (forms, model validation): what a request to this URL would be refused
    for now. A name that does not resolve yet passes: every request is checked again. `resolve`
    (host, port) -> addresses answers the DNS question (tests pass one they control)."""
    allow = allow if allow is not None else allowlist()
    found = target(url, allow)
    if found.address is not None:
        return
    try:
        addresses = resolve(found.host, found.url.port)
    except (OSError, UnicodeError):
        return
    check_resolved(found.host, addresses, allow)


def url_problem(url: str) -> str | None:
    """The save-time check as a form error, None when the URL may be saved."""
    try:
        check_url(url)
    except EgressRefused as refused:
        return (
            f"Sentinel does not send requests here: {refused.reason}. An operator can allow a deliberate "
            f"internal target with {ALLOW_VARIABLE}."
        )
    return None


class GuardedResolver(AbstractResolver):
    """The egress sessions' resolver. aiohttp's connector asks it once per new connection and
    connects to the addresses it returns, nothing else: every one is checked first, so the
    connection goes where the check looked. `inner` answers the DNS questions (aiohttp's threaded
    getaddrinfo by default; tests pass one they control)."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner or aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        allow = allowlist()
        name = host.lower().rstrip(".")
        address = numeric_address(name)
        if address is not None:  # a spelling aiohttp passes on as a name (0x7f.1): read as the resolver would
            problem = refusal(address, allow)
            if problem:
                raise EgressRefused(f"the host {name} is {problem}")
            family = socket.AF_INET if address.version == 4 else socket.AF_INET6
            return [ResolveResult(hostname=host, host=str(address), port=port, family=family, proto=0, flags=0)]
        if internal_name(name) and not allow.allows_host(name):
            raise EgressRefused(f"{name} is an internal host name")
        results = await self._inner.resolve(host, port, family)
        check_resolved(name, [result["host"] for result in results], allow)
        return results

    async def close(self) -> None:
        await self._inner.close()


# --- sending -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes


_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def new_session(
    resolver: AbstractResolver | None = None, ssl_context: ssl.SSLContext | None = None
) -> aiohttp.ClientSession:
    """A session whose every connection goes through the guard. No DNS cache (each connection's one
    lookup is the checked one), no cookies (one tenant's endpoint must not set what another's gets),
    no proxies from the environment, no decompression (the size cap counts the bytes received).
    `resolver` answers DNS questions and `ssl_context` holds the trusted CAs (default: the system's)."""
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(resolver),
        use_dns_cache=False,
        limit=0,  # as the providers' pool: each caller's timeout bounds its wait, not a queue here
        keepalive_timeout=30,
        ssl=ssl_context if ssl_context is not None else True,
    )
    return aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False
    )


def egress_session() -> aiohttp.ClientSession:
    """One guarded connection pool per event loop, kept for the process's life."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        session = _sessions[loop] = new_session()
    return session


async def post(
    url: str,
    *,
    data: bytes,
    headers: dict[str, str],
    timeout: float,
    max_bytes: int = MAX_RESPONSE_BYTES,
    session: aiohttp.ClientSession | None = None,
) -> Reply:
    """POST through the guard, all within `timeout` seconds. A redirect is not followed (the 3xx is
    the answer); an answer over `max_bytes` raises ResponseTooLarge. Refusals raise EgressRefused
    before any connection is made; otherwise aiohttp's errors and TimeoutError."""
    return await _send("POST", url, data=data, headers=headers, timeout=timeout, max_bytes=max_bytes, session=session)


async def get(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float,
    max_bytes: int = MAX_RESPONSE_BYTES,
    session: aiohttp.ClientSession | None = None,
) -> Reply:
    """GET through the guard (a self-hosted deployment's metrics), with `post`'s rules."""
    return await _send(
        "GET", url, data=None, headers=headers or {}, timeout=timeout, max_bytes=max_bytes, session=session
    )


async def _send(
    method: str,
    url: str,
    *,
    data: bytes | None,
    headers: dict[str, str],
    timeout: float,
    max_bytes: int,
    session: aiohttp.ClientSession | None,
) -> Reply:
    found = target(url)
    session = session or egress_session()
    async with asyncio.timeout(timeout):
        async with session.request(
            method,
            found.url,
            data=data,
            headers={**headers, "accept-encoding": "identity"},
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > max_bytes:
                    raise ResponseTooLarge(f"the answer is over {max_bytes} bytes")
            return Reply(response.status, bytes(body))


def post_sync(url: str, **kwargs) -> Reply:
    """`post` for synchronous callers (Celery tasks): an event loop and session of its own, closed after."""

    async def once() -> Reply:
        async with new_session() as session:
            return await post(url, session=session, **kwargs)

    return asyncio.run(once())
