"""callgate's client distribution (``callgate-sdk``): the wire formats shared with the server
and the clients an agent uses. Depends on httpx, pydantic and rfc8785 only (no Django)."""

__version__ = "0.1.0"
