"""Which `Host` headers the view answers: the names its address is reached by, and no other (DNS rebinding).

A page on another site can make the browser resolve its own name to the view's address and then read the
API as if it were that site. The request still carries the other site's name in `Host`, so the server
answers only the names its listening address is reached by:

- the address itself, written as a URL writes it (`127.0.0.2`, `[::1]`), with or without `:PORT`;
- the name given to `--host` (`localhost`, or a hostname that resolved to the address);
- for a loopback address (127.0.0.0/8, ::1), also `localhost`;
- for a wildcard address (0.0.0.0, ::, every interface), any address written as an IP literal, `localhost`
  and this machine's own hostname (`socket.gethostname()`, and its fully qualified form). A literal address
  cannot be rebound; another DNS name of the machine is refused (reach the page by address then).

A port given in `Host` must be the server's own.
"""

from __future__ import annotations

import ipaddress
import re
import socket

__all__ = ["HostCheck", "is_loopback", "parse_host"]

_PORT = re.compile(r"[0-9]{1,5}")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*")


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is this machine only."""
    address = _address(host.strip("[]"))
    return host.lower().rstrip(".") == "localhost" if address is None else address.is_loopback


def parse_host(value: str) -> tuple[str, int | None] | None:
    """A `Host` header as (name or address in lower case, port or None); None when it is not one: an IPv6
    address outside brackets, a port that is not a number, a name with characters no name has."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if _address(name) is None or _address(name).version != 6:  # type: ignore[union-attr]
            return None
    else:
        if value.count(":") > 1:
            return None
        name, colon, port_text = value.partition(":")
        rest = colon + port_text
        # `localhost.` is `localhost` written as a fully qualified name
        name = name.rstrip(".")
        if _address(name) is None and not _NAME.fullmatch(name):
            return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]) or int(rest[1:]) > 65535:
        return None
    return name, int(rest[1:])


def _canonical(name: str) -> str:
    """An address written one way (`::0:1` and `::1` are one address); a name as it is."""
    address = _address(name)
    return str(address) if address is not None else name


class HostCheck:
    """The Host names a server listening on `bound` (the address the socket holds) at `port` answers;
    `given` is what `--host` said (a name resolves to `bound`)."""

    def __init__(self, given: str, bound: str, port: int) -> None:
        self.port = port
        address = _address(bound)
        self.wildcard = bool(address is not None and address.is_unspecified)
        self.names = {_canonical(bound), _canonical(given.strip("[]").lower().rstrip("."))}
        if self.wildcard or (address is not None and address.is_loopback):
            self.names.add("localhost")
        if self.wildcard:
            self.names |= {n.lower().rstrip(".") for n in (socket.gethostname(), socket.getfqdn()) if n}

    def allows(self, header: str | None) -> bool:
        """Whether a request whose `Host` header is `header` is answered."""
        parsed = parse_host(header or "")
        if parsed is None:
            return False
        name, port = parsed
        if port is not None and port != self.port:
            return False
        if self.wildcard and _address(name) is not None:
            return True
        return _canonical(name) in self.names

    def describe(self) -> str:
        """The names answered, for the 403 message."""
        shown = sorted(f"[{n}]" if ":" in n else n for n in self.names) + (["any IP address"] if self.wildcard else [])
        return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
