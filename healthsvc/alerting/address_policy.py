"""Where webhooks may go: not to the service's own network neighbourhood unless an operator says so.

Anyone who can add a subscription could otherwise make the service POST to
``http://169.254.169.254/`` (cloud metadata), to ``127.0.0.1`` (the service's own admin ports),
or into a private network. By default a webhook URL is refused when its host resolves to a
loopback, link-local (metadata included), private, shared (100.64/10), multicast, reserved or
unspecified (``0.0.0.0``) address, or is a known metadata host name. An IPv6 address that carries
an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, 6to4 ``2002:AABB:CCDD::/48``, NAT64 ``64:ff9b::/96``,
Teredo's client) is judged by the IPv4 address it reaches too: ``http://[2002:a9fe:a9fe::]/``
is the metadata address by another name. ``allowed_networks``
(``HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS``, comma-separated CIDRs such as ``10.0.0.0/8,127.0.0.0/8``)
opens what an operator needs.

The check runs when a subscription is made and again before every delivery, since DNS can
change in between. (A name that changes between the check and the connection a moment later is
not caught; resolve-and-pin would need a custom transport.)

    >>> AddressPolicy().refusal("http://169.254.169.254/latest/meta-data")
    'http://169.254.169.254/latest/meta-data resolves to 169.254.169.254, a link-local address; webhooks to it are refused (HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS opens a network)'
    >>> AddressPolicy.parse("127.0.0.0/8").refusal("http://127.0.0.1:9000/hook") is None
    True
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                            "instance-data.ec2.internal"})
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")   # RFC 6052's well-known prefix: the last 32 bits are the IPv4 address


def _resolve(host: str, port: int) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)})


def embedded_ipv4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries and reaches (mapped, 6to4, NAT64, Teredo), else None.

    >>> embedded_ipv4(ipaddress.ip_address("2002:a9fe:a9fe::"))
    IPv4Address('169.254.169.254')
    >>> embedded_ipv4(ipaddress.ip_address("64:ff9b::7f00:1"))
    IPv4Address('127.0.0.1')
    """
    if not isinstance(addr, ipaddress.IPv6Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.teredo is not None:
        return addr.teredo[1]
    return None


def classify(addr: IPAddress) -> str | None:
    """Why an address is internal ("loopback", "link-local", ...), or None when it is public.
    An address carrying an IPv4 one is internal if that one is (a NAT64 address is otherwise
    judged by it alone: its prefix is only the translator's)."""
    inner = embedded_ipv4(addr)
    if inner is not None:
        why = classify(inner)
        # (an address carrying an IPv4 one is an IPv6 address)
        if why is not None or addr in _NAT64 or (isinstance(addr, ipaddress.IPv6Address)
                                                 and addr.ipv4_mapped is not None):
            return why
    for name, hit in (("unspecified", addr.is_unspecified), ("loopback", addr.is_loopback),
                      ("link-local", addr.is_link_local), ("multicast", addr.is_multicast),
                      ("shared (carrier-grade NAT)", isinstance(addr, ipaddress.IPv4Address) and addr in _SHARED),
                      ("private", addr.is_private), ("reserved", addr.is_reserved)):
        if hit:
            return name
    return None


@dataclass(frozen=True)
class AddressPolicy:
    allowed: tuple[IPNetwork, ...] = ()
    resolve: Callable[[str, int], list[str]] = _resolve

    @classmethod
    def parse(cls, networks: str) -> "AddressPolicy":
        """From comma-separated CIDRs; raises ValueError naming a bad one."""
        allowed = []
        for part in (p.strip() for p in (networks or "").split(",")):
            if part:
                try:
                    allowed.append(ipaddress.ip_network(part, strict=False))
                except ValueError as exc:
                    raise ValueError(f"HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS: {part!r} is not a CIDR: {exc}") from None
        return cls(tuple(allowed))

    def refusal(self, url: str, *, unresolvable_ok: bool = False) -> str | None:
        """None when ``url`` may be sent to, else why not (one sentence). ``unresolvable_ok``:
        a name that does not resolve (now) passes; the delivery then fails and is retried."""
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".").lower()
        if parts.scheme not in ("http", "https") or not host:
            return f"{url} is not an http(s) URL with a host"
        if host in METADATA_HOSTS:
            return f"{url} names a cloud metadata host; webhooks to it are refused"
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            addresses = self.resolve(host, port)
        except (OSError, ValueError, UnicodeError) as exc:
            return None if unresolvable_ok else f"{url}: host {host!r} does not resolve ({exc})"
        for text in addresses:
            addr = ipaddress.ip_address(text.split("%", 1)[0])
            why = classify(addr)
            reached = [a for a in (addr, embedded_ipv4(addr)) if a is not None]
            if why and not any(a in net for a in reached for net in self.allowed if net.version == a.version):
                via = f" (which reaches {reached[1]})" if len(reached) > 1 else ""
                return (f"{url} resolves to {addr}{via}, a {why} address; webhooks to it are refused "
                        "(HEALTHSVC_WEBHOOK_ALLOWED_NETWORKS opens a network)")
        return None
