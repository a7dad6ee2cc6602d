"""Egress control: where an outbound call that a tenant can aim (a webhook URL today) may go.

A tenant chooses the URL, Concord's own process makes the call: without a check, a tenant
admin could make the worker call the machine's own services (Elasticsearch, Redis, a cloud
metadata endpoint) and read their answers back. The rule, after Stripe's smokescreen:

- resolve the host once, refuse every address that is not globally reachable (every block
  of IANA's special-purpose registries marked so, in ``NOT_GLOBALLY_REACHABLE``, plus
  multicast and the deprecated site-local block, and the IPv6 forms that carry such an IPv4
  address: mapped, compatible, 6to4, Teredo, NAT64), unless it lies in an operator's
  allow-list (``CONCORD_WEBHOOK_ALLOWED_NETWORKS``);
- say no more than that to the tenant: a refusal names the rule's class for an address the
  URL itself spells, and for a name only that it reaches no allowed address (whether it did
  not resolve or resolved to a refused one, and to what, is for the server's log alone: a
  delivery log that said "db.internal resolves only to 10.0.3.7" told a tenant which
  internal names exist);
- connect to the address that was checked, never to a second resolution of the name (a DNS
  answer that changes between check and connect, "DNS rebinding", cannot get through);
- at registration, refuse what the URL alone decides: a literal address (in any spelling the
  C resolver accepts: ``127.1``, ``2130706433``, ``0x7f000001``) and ``localhost`` names.

:class:`CheckedTransport` is the httpx transport that applies the rule on every connection
(redirects stay off in its callers, and proxies from the environment are ignored)."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import httpcore
import httpx

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Every block that IANA's special-purpose address registries mark "Globally Reachable: False"
# (https://www.iana.org/assignments/iana-ipv4-special-registry and
# .../iana-ipv6-special-registry, as published in 2025), and the others no webhook goes to:
# multicast, and IPv6 site-local (deprecated by RFC 3879, still routed inside networks). A
# registry's exceptions inside a refused block (anycast PCP and TURN in 192.0.0.0/24, AMT and
# AS112 in 2001::/23) are refused with it: no receiver lives there. Teredo (2001::/32) and
# 6to4 (2002::/16) addresses are refused for what they carry (``embedded_ipv4``) first.
NOT_GLOBALLY_REACHABLE: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private-use"),
    ("100.64.0.0/10", "shared-address-space"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private-use"),
    ("192.0.0.0/24", "ietf-protocol-assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "deprecated-6to4-relay"),
    ("192.168.0.0/16", "private-use"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "limited-broadcast"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", "ipv4-mapped"),
    ("64:ff9b:1::/48", "local-use-translation"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy"),
    ("2001::/23", "ietf-protocol-assignments"),
    ("2001:2::/48", "benchmarking"),
    ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment-routing"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
_REFUSED_BLOCKS = tuple(
    (ipaddress.ip_network(block), rule) for block, rule in NOT_GLOBALLY_REACHABLE
)
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
    """The class of the rule that refuses ``address`` ("loopback", "private-use", ...), or
    None where it may be reached."""
    if any(address in network for network in allowed):
        return None
    inner = embedded_ipv4(address)
    if inner is not None:
        rule = refusal(inner, allowed)
        return None if rule is None else f"{rule} (carried in an IPv6 address)"
    for network, rule in _REFUSED_BLOCKS:
        if address.version == network.version and address in network:
            return rule
    if not address.is_global:  # whatever Python's own tables know besides
        return "not-globally-reachable"
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
        rule = refusal(address, allowed)
        if rule is not None:
            raise EgressRefused(f"the address is {rule}")
    elif _names_this_machine(host) and refusal(_LOOPBACK, allowed) is not None:
        raise EgressRefused("the name means this machine")


# What a tenant is told of a name that reaches no allowed address: the same whether it did
# not resolve, or resolved only to refused addresses (and to which).
NAME_REFUSED = "the name resolves to no address a webhook may reach"


def _names_this_machine(host: str) -> bool:
    return host in _LOCALHOST_NAMES or host.endswith(".localhost")


async def resolve_checked(host: str, port: int, allowed: Sequence[Network]) -> Address:
    """``host`` resolved once, to its first address that may be reached."""
    literal = literal_address(host)
    if literal is not None:
        rule = refusal(literal, allowed)
        if rule is not None:
            raise EgressRefused(f"the address is {rule}")
        return literal
    try:
        answers = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        log.info("webhook destination %s does not resolve: %s", host, e)
        raise EgressRefused(NAME_REFUSED) from e
    rules = []
    for _family, _type, _proto, _name, sockaddr in answers:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        rule = refusal(address, allowed)
        if rule is None:
            return address
        rules.append(f"{address} ({rule})")
    log.info("webhook destination %s refused: it resolves to %s", host, ", ".join(rules))
    raise EgressRefused(NAME_REFUSED)


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
