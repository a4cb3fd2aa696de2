"""Outbound HTTP to URLs that users or agents name: the one guard against making callgate
probe its own network (server-side request forgery, OWASP SSRF Prevention Cheat Sheet).

Reconcile look-up URLs come from contracts that agents write; decision and alert webhook
URLs from agents and managers. Every such request goes through ``client()`` (or a
``GuardedTransport`` wrapped around a test transport), which, for each request:

- resolves the host once (``socket.getaddrinfo``) and refuses it when any of its addresses
  is not public (``ipaddress``'s ``is_global`` is False: loopback, private, link-local such
  as cloud metadata at 169.254.169.254, shared, reserved, multicast, unspecified), judging
  an IPv6 address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``,
  IPv4-compatible ``::a.b.c.d``, IPv4-translated ``::ffff:0:a.b.c.d``, NAT64
  ``64:ff9b::/96`` and ``64:ff9b:1::/48``, 6to4 ``2002::/16``, Teredo) by both, and
  refusing site-local ``fec0::/10`` and ``192.0.0.0/24`` outright; every spelling of an address that
  the resolver accepts (``127.1``, ``0x7f000001``, ``2130706433``, ``[::1]``) is judged by
  what it resolves to;
- connects to the address it checked (the URL's host is replaced by that address; the
  ``Host`` header and TLS's server name and certificate check keep the name), so a name
  that answers differently a moment later (DNS rebinding) cannot redirect the request;
- never follows redirects and ignores proxy environment variables.

``settings.CALLGATE_OUTBOUND_ALLOW`` (a list; env ``CALLGATE_OUTBOUND_ALLOW``, comma
separated) admits what the rule would refuse, for tests and on-premise targets: a network
in CIDR notation (``10.1.0.0/16``, ``127.0.0.1/32``, ``fd00::/8``) admits addresses in it;
a host name (``hooks.internal.example``) is trusted whatever it resolves to and reached by
its name. A refused request raises ``OutboundRefused`` (an ``httpx.TransportError``) before
any connection; a host that does not resolve raises ``httpx.ConnectError``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import cast

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: IPv6 prefixes whose last 32 bits are an IPv4 address: NAT64's well-known prefix
#: (RFC 6052), the local-use NAT64 prefix (RFC 8215: 64:ff9b:1::/48, any position inside it
#: is judged by its last 32 bits), IPv4-compatible (RFC 4291 2.5.5.1, deprecated, ::/96)
#: and IPv4-translated (RFC 2765 2.1, ::ffff:0:0:0/96).
EMBEDDING_IPV4 = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
    ipaddress.IPv6Network("::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
)
#: Ranges refused outright, whatever ``is_global`` says on this Python: IPv6 site-local
#: (fec0::/10, deprecated by RFC 3879 but still routed inside some networks) and the IETF
#: protocol assignments (192.0.0.0/24, RFC 6890; 192.0.0.8 is the IPv4 dummy address of
#: RFC 7600, and 192.0.0.9/.10, which Python calls global, are anycast service addresses).
NEVER_PUBLIC = (
    ipaddress.IPv6Network("fec0::/10"),
    ipaddress.IPv4Network("192.0.0.0/24"),
)


class OutboundRefused(httpx.TransportError):
    """The request's host is one callgate may not reach (the message says why and how to
    admit it)."""


def allow_list() -> tuple[list[IPNetwork], set[str]]:
    """``(networks, host names)`` of ``settings.CALLGATE_OUTBOUND_ALLOW``. Raises
    ``ImproperlyConfigured`` for an entry with a ``/`` that is no network."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    for raw in getattr(settings, "CALLGATE_OUTBOUND_ALLOW", []):
        entry = raw.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            if "/" in entry:
                raise ImproperlyConfigured(
                    f"CALLGATE_OUTBOUND_ALLOW: {raw!r} is neither a network (CIDR) nor a host"
                ) from None
            hosts.add(entry.rstrip("."))
    return networks, hosts


def _embedded(address: IPAddress) -> list[IPAddress]:
    """``address`` and the IPv4 addresses an IPv6 one carries."""
    found: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped:
            found.append(address.ipv4_mapped)
        if address.sixtofour:
            found.append(address.sixtofour)
        if address.teredo:
            found.append(address.teredo[1])
        if any(address in prefix for prefix in EMBEDDING_IPV4):
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def address_refusal(address: IPAddress, *, networks: Iterable[IPNetwork] = ()) -> str | None:
    """Why callgate will not connect to ``address``, or None: it, and every IPv4 address it
    carries, is public or in one of ``networks``."""
    nets = list(networks)
    for candidate in _embedded(address):
        if any(candidate.version == n.version and candidate in n for n in nets):
            continue
        if not candidate.is_global or any(
            candidate.version == n.version and candidate in n for n in NEVER_PUBLIC
        ):
            return f"a non-public address ({address})"
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """The TCP addresses ``host`` resolves to, in the resolver's order (an IP literal is
    itself). Raises ``OSError`` when it does not resolve."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    addresses: list[IPAddress] = []
    for info in infos:
        # an IP address as text: TCP look-ups answer AF_INET and AF_INET6 addresses only
        address = ipaddress.ip_address(cast(str, info[4][0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def pin(request: httpx.Request, *, admit_origins: Iterable[str] = ()) -> None:
    """Check ``request``'s host and point the request at the address that was checked.

    ``admit_origins`` (``scheme://host[:port]``, lower-case) are origins the caller's own
    setting admits (``CALLGATE_RECONCILE_ORIGINS``): reached by name, like allowed hosts.
    Raises ``OutboundRefused`` (not admitted) or ``httpx.ConnectError`` (does not resolve)."""
    url = request.url
    host = url.host.lower().rstrip(".")
    origin = f"{url.scheme}://{url.netloc.decode('ascii')}".lower()
    networks, hosts = allow_list()
    if host in hosts or origin in set(admit_origins):
        return
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError, ValueError) as exc:
        raise httpx.ConnectError(f"{host} does not resolve: {exc}", request=request) from exc
    if not addresses:
        raise httpx.ConnectError(f"{host} does not resolve", request=request)
    for address in addresses:
        if why := address_refusal(address, networks=networks):
            raise OutboundRefused(
                f"{host} resolves to {why}; add it to CALLGATE_OUTBOUND_ALLOW to let "
                "callgate send requests there",
                request=request,
            )
    checked = str(addresses[0])
    if checked != host:
        request.url = url.copy_with(host=checked)
        if (
            url.scheme == "https"
        ):  # TLS names and checks the certificate of the host, not the address
            request.extensions = {**request.extensions, "sni_hostname": host}


def url_refusal(url: str) -> str | None:
    """Why callgate will not send requests to ``url``, or None: the check of ``pin`` made
    ahead, for a form that stores a URL (a webhook) to say so beside the field. A URL that is
    not ``http(s)://host`` is refused; a host that does not resolve now is not (it may
    later: the request then fails as a connection error)."""
    try:
        request = httpx.Request("POST", url)
    except (httpx.InvalidURL, ValueError) as exc:
        return f"not a URL ({exc})"
    if request.url.scheme not in ("http", "https") or not request.url.host:
        return "only http:// and https:// URLs with a host are reached"
    try:
        pin(request)
    except OutboundRefused as exc:
        return str(exc)
    except httpx.ConnectError:
        return None
    return None


class GuardedTransport(httpx.BaseTransport):
    """``inner`` (httpx's network transport unless given: tests pass a mock or a local
    server's) behind ``pin``: each request is checked and pinned before it is sent."""

    def __init__(
        self, inner: httpx.BaseTransport | None = None, *, admit_origins: Iterable[str] = ()
    ) -> None:
        self.inner = inner if inner is not None else httpx.HTTPTransport()
        self.admit_origins = frozenset(o.rstrip("/").lower() for o in admit_origins)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        pin(request, admit_origins=self.admit_origins)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def client(
    *,
    timeout: float,
    transport: httpx.BaseTransport | None = None,
    admit_origins: Iterable[str] = (),
) -> httpx.Client:
    """An ``httpx.Client`` for user-named URLs: guarded (``GuardedTransport`` around
    ``transport``), no redirects followed, no proxies from the environment."""
    return httpx.Client(
        transport=GuardedTransport(transport, admit_origins=admit_origins),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
    )
