"""Which ``Host`` header names the service answers to (DNS rebinding).

A web page on ``evil.example`` can point its own name at 127.0.0.1 and then talk to a service on
localhost as if same-origin; the request it makes still says ``Host: evil.example``. So by
default only the names the service is reached by directly are served:

- the loopback names (``localhost``, ``127.0.0.0/8``, ``::1``);
- the address it listens on (``HEALTHSVC_HOST``) and the host of ``HEALTHSVC_EXTERNAL_URL``;
- listening on every address (``0.0.0.0``, ``::``): any IP address literal (a rebinding page
  sends its own name, never an address) and this machine's host name and FQDN;
- the extra names of ``HEALTHSVC_ALLOWED_HOSTS`` (comma-separated: a proxy's or a cluster
  service's name), or ``*`` for any Host at all.

The port of the header is not compared (a proxy may change it). A request without ``Host`` (HTTP/1.0)
is served: browsers always send one, so it is no rebinding.

    >>> policy = HostPolicy.for_listener("127.0.0.1", extra="healthsvc.internal")
    >>> [policy.allows(h) for h in ("127.0.0.1:8080", "localhost", "[::1]:80", "healthsvc.internal", "evil.example")]
    [True, True, True, True, False]
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::", "[::]"})


def is_loopback(listen_host: str) -> bool:
    """Whether a listen address serves this machine only.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0"), is_loopback("10.0.0.1")
    (True, True, False, False)
    """
    name = host_name(listen_host)
    if name in LOOPBACK_NAMES:
        return True
    addr = _address(name)
    return addr is not None and addr.is_loopback


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port, brackets or trailing dot, lower case.

    >>> host_name("[::1]:8080"), host_name("Example.COM.:80"), host_name("10.0.0.1")
    ('::1', 'example.com', '10.0.0.1')
    """
    header = header.strip()
    if header.startswith("["):
        name = header[1:].split("]", 1)[0]
    elif header.count(":") == 1:
        name = header.split(":", 1)[0]
    else:                       # no port, or a bare IPv6 literal (not valid in Host, but harmless)
        name = header
    return name.rstrip(".").lower()


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostPolicy:
    names: frozenset[str]
    any_address: bool = False      # listening on every address: IP literals are served
    any_host: bool = False         # HEALTHSVC_ALLOWED_HOSTS=*

    @classmethod
    def for_listener(cls, listen_host: str, *, extra: str = "", external_url: str = "") -> "HostPolicy":
        extras = {host_name(h) for h in extra.split(",") if h.strip()}
        names = set(LOOPBACK_NAMES) | (extras - {"*"})
        wildcard = listen_host.strip() in WILDCARD_ADDRESSES
        if not wildcard:
            names.add(host_name(listen_host))
        else:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        if external_url:
            names.add(host_name(urlsplit(external_url).netloc.rsplit("@", 1)[-1]))
        return cls(frozenset(names), any_address=wildcard, any_host="*" in extras)

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header (None: none sent) is served."""
        if self.any_host or header is None:
            return True
        return _allowed(self, header)


@lru_cache(maxsize=1024)   # asked for every request, and clients send the same header each time
def _allowed(policy: HostPolicy, header: str) -> bool:
    name = host_name(header)
    if name in policy.names:
        return True
    addr = _address(name)
    return addr is not None and (addr.is_loopback or policy.any_address)
