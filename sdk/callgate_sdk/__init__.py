"""callgate's client distribution (``callgate-sdk``): the wire formats shared with the server
(``wire``: canonical JSON, operation IDs, redaction; ``providers``: provider formats) and
the clients an agent uses to gate its tool calls. Depends on httpx, pydantic and rfc8785
only (no Django). Framework adapters: ``callgate_sdk.integrations``."""

from callgate_sdk._protocol import (  # noqa: E402
    current_operation_id,
    current_request,
    request_context,
)
from callgate_sdk._version import __version__ as __version__
from callgate_sdk.buffer import EventBuffer  # noqa: E402
from callgate_sdk.client import (  # noqa: E402
    AsyncCallgateClient,
    AsyncGatedTool,
    CallgateClient,
    GatedTool,
    SelfCorrector,
)
from callgate_sdk.errors import (  # noqa: E402
    CallgateError,
    CallgateUnavailable,
    CallNotAllowed,
    ToolFailure,
    failure_cause,
)
from callgate_sdk.models import (  # noqa: E402
    CallAnswer,
    RetryPolicy,
    RunResult,
    ToolRegistration,
)
from callgate_sdk.resilience import CircuitBreaker, backoff_delay  # noqa: E402

__all__ = [
    "AsyncCallgateClient",
    "AsyncGatedTool",
    "CallAnswer",
    "CallNotAllowed",
    "CallgateClient",
    "CallgateError",
    "CallgateUnavailable",
    "CircuitBreaker",
    "EventBuffer",
    "GatedTool",
    "RetryPolicy",
    "RunResult",
    "SelfCorrector",
    "ToolFailure",
    "ToolRegistration",
    "backoff_delay",
    "current_operation_id",
    "current_request",
    "failure_cause",
    "request_context",
]
