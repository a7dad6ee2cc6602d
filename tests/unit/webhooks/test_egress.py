"""Egress control's rule (shared/egress.py): every spelling of a non-public address is
refused, with and without an operator's allow-list; public addresses and names pass."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from shared.egress import EgressRefused, check_destination_url, literal_address, refusal
from shared.settings import Settings

# Every spelling of a refused address seen from an attacker, and where each lands.
REFUSED_HOSTS = {
    "127.0.0.1": "127.0.0.1",
    "localhost": None,
    "LOCALHOST.": None,
    "api.localhost": None,
    "[::1]": "::1",
    "0.0.0.0": "0.0.0.0",
    "2130706433": "127.0.0.1",
    "127.1": "127.0.0.1",
    "0x7f000001": "127.0.0.1",
    "0x7f.1": "127.0.0.1",
    "169.254.169.254": "169.254.169.254",
    "10.1.2.3": "10.1.2.3",
    "172.16.0.1": "172.16.0.1",
    "192.168.1.1": "192.168.1.1",
    "100.64.0.1": "100.64.0.1",
    "224.0.0.1": "224.0.0.1",
    "240.0.0.1": "240.0.0.1",
    "[::ffff:127.0.0.1]": "::ffff:7f00:1",
    "[::ffff:10.0.0.1]": "::ffff:a00:1",
    "[::127.0.0.1]": "::7f00:1",
    "[2002:7f00:1::]": "2002:7f00:1::",
    "[64:ff9b::a9fe:a9fe]": "64:ff9b::a9fe:a9fe",
    "[fe80::1]": "fe80::1",
    "[fc00::1]": "fc00::1",
    "[ff02::1]": "ff02::1",
    # Before, these passed (site-local IPv6, IETF protocol assignments), and the rest of
    # IANA's special-purpose blocks that are not globally reachable
    "[fec0::1]": "fec0::1",
    "192.0.0.9": "192.0.0.9",
    "192.0.0.170": "192.0.0.170",
    "198.18.0.1": "198.18.0.1",
    "192.88.99.1": "192.88.99.1",
    "[64:ff9b:1::1]": "64:ff9b:1::1",
    "[100::1]": "100::1",
    "[2001:2::1]": "2001:2::1",
    "[3fff::1]": "3fff::1",
    "[5f00::1]": "5f00::1",
}
# Forms that mean 127.0.0.1 exactly: the allow-list 127.0.0.1/32 lets these through.
MEANS_127_0_0_1 = {"127.0.0.1", "localhost", "LOCALHOST.", "api.localhost", "2130706433",
                   "127.1", "0x7f000001", "0x7f.1", "[::ffff:127.0.0.1]", "[::127.0.0.1]",
                   "[2002:7f00:1::]"}  # fmt: skip


@pytest.mark.parametrize("host", sorted(REFUSED_HOSTS))
def test_every_spelling_of_a_non_public_address_is_refused_with_and_without_the_allow_list(
    host: str,
) -> None:
    url = httpx.URL(f"http://{host}:9200/some-index/_doc")
    literal = literal_address(host)
    assert (None if literal is None else str(literal)) == REFUSED_HOSTS[host]
    with pytest.raises(EgressRefused):
        check_destination_url(url, ())
    allowed = Settings(webhook_allowed_networks="127.0.0.1/32").webhook_allowed()
    if host in MEANS_127_0_0_1:
        check_destination_url(url, allowed)  # the operator allowed exactly this
    else:
        with pytest.raises(EgressRefused):
            check_destination_url(url, allowed)


def test_public_addresses_and_names_pass_and_the_allow_list_opens_only_its_networks() -> None:
    for host in ("93.184.215.14", "[2606:4700::1111]", "hooks.example.com"):
        check_destination_url(httpx.URL(f"https://{host}/hook"), ())
    private = Settings(webhook_allowed_networks="10.20.0.0/16, 192.168.7.0/24").webhook_allowed()
    assert refusal(ipaddress("10.20.3.4"), private) is None
    assert refusal(ipaddress("10.21.3.4"), private) is not None
    assert refusal(ipaddress("::ffff:192.168.7.9"), private) is None  # the same host, mapped
    with pytest.raises(ValueError, match="CIDRs"):
        Settings(webhook_allowed_networks="10.0.0.0/33")


def ipaddress(text: str) -> Any:
    import ipaddress as ip

    return ip.ip_address(text)


def test_a_refusal_names_the_rules_class_and_nothing_of_what_it_resolved() -> None:
    with pytest.raises(EgressRefused) as refused:
        check_destination_url(httpx.URL("http://[fec0::1]/hook"), ())
    assert str(refused.value) == "the address is site-local"
    assert refusal(ipaddress("192.0.0.9")) == "ietf-protocol-assignments"
    assert refusal(ipaddress("::ffff:10.0.0.1")) == "private-use (carried in an IPv6 address)"


def test_the_refused_blocks_are_one_table_of_valid_networks() -> None:
    import ipaddress as ip

    from shared.egress import NOT_GLOBALLY_REACHABLE

    networks = [ip.ip_network(block) for block, _ in NOT_GLOBALLY_REACHABLE]
    assert len(networks) == len(set(networks))
    # every block is refused, at its first and last address
    for network in networks:
        assert refusal(network[0]) is not None and refusal(network[-1]) is not None
