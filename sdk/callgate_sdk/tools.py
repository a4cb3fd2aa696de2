"""Gated tools: ``@client.tool(...)`` turns a plain function into a tool whose every call goes
through callgate (the gate, one execution under the operation ID, the attempt reported).

The contract comes from the function: its parameters (type hints, defaults) become a pydantic
model whose JSON Schema is the contract's ``parameters``; the docstring's first part is the
description and its ``Args:`` section (Google style) the parameters' descriptions. A
parameter named ``operation_id`` is left out of the schema and receives the operation ID,
to pass on as the target's idempotency key.
"""

from __future__ import annotations

import inspect
import re
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from callgate_sdk._protocol import ToolInfo
from callgate_sdk.errors import ToolFailure
from callgate_sdk.models import Effect, RetryPolicy

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$"
)
_PARAM = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a Google-style docstring: the text
    before the first section, and the entries of its ``Args:`` section."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section, current = None, None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            entry = _PARAM.match(line)
            if entry and (len(line) - len(line.lstrip())) <= 4:
                current = entry.group(1).lstrip("*")
                params[current] = entry.group(3).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return "\n".join(description).strip(), params


@dataclass
class ToolSpec:
    """A function's contract: its name, description, argument model, and the options of
    ``client.tool``. ``contract()`` is the body of ``register_tool``."""

    fn: Callable[..., Any]
    name: str
    description: str
    model: type[BaseModel]
    wants_operation_id: bool
    effect: Effect
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Effect = "write",
        **options: Any,
    ) -> ToolSpec:
        """Read the contract from ``fn``. Raises ``TypeError`` for ``*args``/``**kwargs``
        (a tool's arguments are a JSON object of named fields)."""
        summary, documented = parse_docstring(fn.__doc__)
        hints = typing.get_type_hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        wants_op = False
        for parameter in inspect.signature(fn).parameters.values():
            if parameter.name == "operation_id":
                wants_op = True
                continue
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise TypeError(
                    f"{fn.__name__}: *args and **kwargs cannot be described as a tool's arguments"
                )
            default = ... if parameter.default is parameter.empty else parameter.default
            fields[parameter.name] = (
                hints.get(parameter.name, Any),
                Field(default, description=documented.get(parameter.name)),
            )
        model = create_model(
            f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        return cls(
            fn=fn,
            name=name or fn.__name__,
            description=description if description is not None else summary,
            model=model,
            wants_operation_id=wants_op,
            effect=effect,
            options=options,
        )

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def contract(self) -> dict[str, Any]:
        """Keyword arguments for ``register_tool``: the schema, description, effect, options.
        ``reconcile`` (a URL template with ``{operation_id}``) makes the tool reconcilable."""
        options = dict(self.options)
        reconcile = options.pop("reconcile", None)
        if isinstance(options.get("retry"), dict):
            options["retry"] = RetryPolicy(**options["retry"])
        if reconcile is not None:
            options.update(reconcilable=True, reconcile_url=reconcile)
        return {
            "parameters": self.model,
            "description": self.description,
            "effect": self.effect,
            **options,
        }

    def tool_info(self) -> ToolInfo:
        """What the client needs to decide locally while callgate cannot be reached."""
        contract = self.contract()
        return ToolInfo(
            effect=self.effect,
            idempotent=bool(contract.get("idempotent", False)),
            max_attempts=int(contract.get("max_attempts", 3)),
            retry=contract.get("retry") or RetryPolicy(),
        )

    def proposal(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call as the model would have proposed it: ``{"tool", "arguments"}`` with the
        arguments as JSON values (not validated here: the gate validates them)."""
        bound = inspect.signature(self.fn).bind_partial(*args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "operation_id"}
        return {"tool": self.name, "arguments": to_jsonable_python(arguments, fallback=str)}

    def call_arguments(self, arguments: dict, operation_id: str) -> dict[str, Any]:
        """The keyword arguments to call the function with, from the gate's JSON arguments
        (validated into the parameters' types). A ``ValidationError`` here means the tool never
        ran: ``ToolFailure(sent=False)``."""
        try:
            validated = self.model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolFailure(f"arguments: {exc}"[:2000], sent=False) from exc
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if self.wants_operation_id:
            kwargs["operation_id"] = operation_id
        return kwargs


class Registration:
    """Registers a spec's contract once per client (thread-safe); ``PUT /api/v1/tools/{name}``
    is idempotent, so registering again after a restart only checks the contract."""

    def __init__(self) -> None:
        self.done = False
        self.lock = threading.Lock()
