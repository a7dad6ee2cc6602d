"""Egress control: where an outbound call that a tenant can aim (a webhook URL today) may go.

A tenant chooses the URL, Concord's own process makes the call: without a check, a tenant
admin could make the worker call the machine's own services (Elasticsearch, Redis, a cloud
metadata endpoint) and read their answers back. The rule, after Stripe's smokescreen:

- resolve the host once, refuse every address that is not globally routable (loopback,
  private, link-local, unspecified, multicast, reserved, shared/CGNAT, documentation, and
  the IPv6 forms that carry such an IPv4 address: mapped, compatible, 6to4, Teredo, NAT64),
  unless it lies in an operator's allow-list (``CONCORD_WEBHOOK_ALLOWED_NETWORKS``);
- connect to the address that was checked, never to a second resolution of the name (a DNS
  answer that changes between check and connect, "DNS rebinding", cannot get through);
- at registration, refuse what the URL alone decides: a literal address (in any spelling the
  C resolver accepts: ``127.1``, ``2130706433``, ``0x7f000001``) and ``localhost`` names.

:class:`CheckedTransport` is the httpx transport that applies the rule on every connection
(redirects stay off in its callers, and proxies from the environment are ignored)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LOOPBACK = ipaddress.ip_address("127.0.0.1")
_LOCALHOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


class EgressRefused(Exception):
    """The destination is not one a tenant's URL may reach; the message says why."""


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, 6to4, Teredo, NAT64)."""
    if address.version == 4:
        return None
    assert isinstance(address, ipaddress.IPv6Address)
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address (the server's is public by design)
    if address in _NAT64 or (int(address) >> 32 == 0 and int(address) > 1):  # ::a.b.c.d
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refusal(address: Address, allowed: Sequence[Network] = ()) -> str | None:
    """Why ``address`` may not be reached (None where it may)."""
    if any(address in network for network in allowed):
        return None
    inner = embedded_ipv4(address)
    if inner is not None:
        reason = refusal(inner, allowed)
        return None if reason is None else f"{address} carries {inner}: {reason}"
    for kind in ("loopback", "unspecified", "link_local", "multicast", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return f"{address} is a {kind.replace('_', '-')} address"
    if not address.is_global:  # shared (100.64/10), documentation, benchmarking, ...
        return f"{address} is not a globally routable address"
    return None


def literal_address(host: str) -> Address | None:
    """The address ``host`` spells, in any form the C resolver takes as a number (``127.1``,
    ``2130706433``, ``0x7f.1``, ``[::1]``), or None for a name."""
    bare = host.strip("[]").split("%", 1)[0]  # an IPv6 zone id is not part of the address
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))
    except OSError:
        return None


def check_destination_url(url: httpx.URL, allowed: Sequence[Network] = ()) -> None:
    """Refuse, before anything is sent, what the URL alone decides: a literal address that
    :func:`refusal` refuses, or a name that means this machine. Other names are checked when
    they are resolved, at each connection."""
    host = url.host.rstrip(".").lower()
    address = literal_address(host)
    if address is not None:
        reason = refusal(address, allowed)
        if reason is not None:
            raise EgressRefused(reason)
    elif _names_this_machine(host) and refusal(_LOOPBACK, allowed) is not None:
        raise EgressRefused(f"{host} names this machine")


def _names_this_machine(host: str) -> bool:
    return host in _LOCALHOST_NAMES or host.endswith(".localhost")


async def resolve_checked(host: str, port: int, allowed: Sequence[Network]) -> Address:
    """``host`` resolved once, to its first address that may be reached."""
    literal = literal_address(host)
    if literal is not None:
        reason = refusal(literal, allowed)
        if reason is not None:
            raise EgressRefused(reason)
        return literal
    try:
        answers = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from e
    reasons = []
    for _family, _type, _proto, _name, sockaddr in answers:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        reason = refusal(address, allowed)
        if reason is None:
            return address
        reasons.append(reason)
    raise EgressRefused(f"{host} resolves only to refused addresses ({'; '.join(reasons)})")


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks and connects to the checked address (TLS still verifies and sends
    the URL's host name: httpcore passes it to ``start_tls`` itself)."""

    def __init__(self, allowed: Sequence[Network]) -> None:
        self.allowed = tuple(allowed)
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = await resolve_checked(host, port, self.allowed)
        return await self.inner.connect_tcp(
            str(address), port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise EgressRefused("unix sockets are never a destination")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class CheckedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport, whose every connection goes through the egress rule. Proxies
    named in the environment are ignored (a proxy would connect on our behalf, unchecked)."""

    def __init__(self, allowed: Sequence[Network] = ()) -> None:
        super().__init__(trust_env=False)
        # httpx builds its pool without a way to pass a network backend: the same pool, with one.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=_CheckedBackend(allowed),
        )
