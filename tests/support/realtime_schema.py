"""Strict validator for OpenAI Realtime **GA** events (tests only).

Reference shapes are the ``openai`` package's pydantic models
(``openai.types.realtime.RealtimeClientEvent`` / ``RealtimeServerEvent``).
Used naively they accept almost anything, so the models are rebuilt once
(lazily, cached) into a parallel set of pydantic models that:

* forbid unknown keys everywhere (``extra="forbid"`` on every rebuilt model,
  which also makes the remaining "smart" unions pick the right member);
* turn every union of models that carry a ``type`` literal (plus ``role`` for
  conversation messages) into a *real* tagged union -> one precise error
  instead of one error per member; ``type`` may only be omitted where exactly
  one member declares it optional (e.g. a flat function tool);
* accept ``{"type": "item_reference", "id": ...}`` in ``response.create``
  ``response.input`` (only present in the TypedDict params, not the models);
* enforce metadata limits (<= 16 pairs, keys <= 64 chars, values <= 512);
* allow exactly ``id`` / ``object`` / ``expires_at`` in the session object
  of ``session.created`` / ``session.updated`` (the real server sends them,
  the models lack them).

Validation runs with ``strict=True``: no str->int coercion, no 0/1 for bools,
no ``1.0`` for an int field.  Pydantic's strict float still accepts ints
(``"speed": 1``), which is what JSON producers do, so nothing had to be relaxed.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Dict, List, Literal, Optional, Union, get_args, get_origin

import typing_extensions
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    create_model,
)
from typing_extensions import Annotated

__all__ = ["SchemaViolation", "validate_client_event", "validate_server_event"]


class SchemaViolation(ValueError):
    """An event does not match the GA schema.

    ``event_type``: the event's ``type`` (or None), ``path``: dotted path of the
    first problem ('' = the event itself), ``kind``: short machine code such as
    ``unknown_parameter``, ``unknown_event_type``, ``invalid_value``,
    ``missing_required_parameter``.
    """

    def __init__(self, message: str, *, event_type: Any = None, path: str = "", kind: str = "invalid_value"):
        super().__init__(message)
        self.event_type = event_type
        self.path = path
        self.kind = kind


# Beta names that changed in GA -> hint in the error message.
_BETA_HINTS = {
    "response.audio.delta": "response.output_audio.delta",
    "response.audio.done": "response.output_audio.done",
    "response.audio_transcript.delta": "response.output_audio_transcript.delta",
    "response.audio_transcript.done": "response.output_audio_transcript.done",
    "response.text.delta": "response.output_text.delta",
    "response.text.done": "response.output_text.done",
    "transcription_session.update": "session.update with session.type='transcription'",
}

_NONE = type(None)
_Metadata = Annotated[
    Dict[Annotated[str, StringConstraints(max_length=64)], Annotated[str, StringConstraints(max_length=512)]],
    Field(max_length=16),
]


def _literal_values(annotation: Any) -> tuple[list[Any], bool]:
    """(literal values, optional?) of a ``Literal[...]`` / ``Optional[Literal[...]]``."""
    optional = False
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not _NONE]
        optional = len(args) != len(get_args(annotation))
        if len(args) != 1:
            return [], optional
        annotation = args[0]
    if get_origin(annotation) is Literal:
        return list(get_args(annotation)), optional
    return [], optional


class _Rebuilder:
    def __init__(self) -> None:
        self._models: dict[type, type[BaseModel]] = {}
        self.model_names: set[str] = set()
        self.overrides: dict[tuple[type, str], Any] = {}

    # -- types -------------------------------------------------------------
    def conv(self, tp: Any) -> Any:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return self.model(tp)
        origin = get_origin(tp)
        if origin is Annotated:
            inner, *meta = get_args(tp)
            # openai's PropertyInfo(discriminator=...) is ignored by pydantic;
            # unions are re-tagged in _union anyway, so drop it.
            meta = [m for m in meta if type(m).__name__ != "PropertyInfo"]
            new = self.conv(inner)
            return Annotated[(new, *meta)] if meta else new
        if origin in (Union, types.UnionType):
            return self._union(get_args(tp))
        if origin in (list, List):
            return List[self.conv(get_args(tp)[0])]
        if origin in (dict, Dict):
            k, v = get_args(tp)
            return Dict[self.conv(k), self.conv(v)]
        if origin is not None and origin is not Literal:
            raise TypeError(f"realtime_schema: unsupported annotation {tp!r}")
        return tp

    def _union(self, args: tuple[Any, ...]) -> Any:
        flat: list[Any] = []
        for a in args:  # flatten Annotated[Union[...], PropertyInfo] members
            if get_origin(a) is Annotated and get_origin(get_args(a)[0]) in (Union, types.UnionType):
                flat.extend(get_args(get_args(a)[0]))
            else:
                flat.append(a)
        models = [a for a in flat if isinstance(a, type) and issubclass(a, BaseModel)]
        others = [self.conv(a) for a in flat if a is not _NONE and a not in models]
        parts = others + ([self._tagged(models)] if models else [])
        if _NONE in flat:
            parts.append(_NONE)
        return parts[0] if len(parts) == 1 else Union[tuple(parts)]

    def _tagged(self, models: list[type[BaseModel]]) -> Any:
        if len(models) == 1:
            return self.model(models[0])
        keymap: dict[str, str] = {}
        defaults: list[str] = []
        choices = []
        for m in models:
            f = m.model_fields.get("type")
            values, optional = _literal_values(f.annotation) if f else ([], False)
            if not values:
                return Union[tuple(self.model(x) for x in models)]  # cannot tag: smart union
            roles, _ = _literal_values(m.model_fields["role"].annotation) if "role" in m.model_fields else ([], False)
            keys = [f"{v}/{r}" for v in values for r in roles] if roles else [str(v) for v in values]
            tag = f"<{keys[0]}>"
            for k in keys:
                if k in keymap:
                    return Union[tuple(self.model(x) for x in models)]
                keymap[k] = tag
            if optional or not f.is_required():
                defaults.append(tag)
            choices.append(Annotated[self.model(m), Tag(tag)])
        default = defaults[0] if len(defaults) == 1 else None

        def discriminate(v: Any) -> Optional[str]:
            if isinstance(v, BaseModel):
                v = v.model_dump(exclude_unset=True)
            if not isinstance(v, dict):
                return None
            if "type" not in v:
                return default
            t, key = v["type"], f"{v['type']}/{v.get('role')}"
            if key in keymap or (str(t) not in keymap and any(k.startswith(f"{t}/") for k in keymap)):
                return keymap.get(key, key)  # message items: tagged by type/role
            return keymap.get(str(t), str(t))

        return Annotated[Union[tuple(choices)], Discriminator(discriminate)]

    # -- models ------------------------------------------------------------
    def model(self, cls: type[BaseModel]) -> type[BaseModel]:
        if cls in self._models:
            if self._models[cls] is None:
                raise TypeError(f"realtime_schema: recursive model {cls.__name__} unsupported")
            return self._models[cls]
        self._models[cls] = None  # type: ignore[assignment]  # recursion guard
        fields: dict[str, Any] = {}
        for name, f in cls.model_fields.items():
            ann = self.overrides.get((cls, name), f.annotation)
            if name == "metadata" and ann == Optional[Dict[str, str]]:
                ann = Optional[_Metadata]
            else:
                ann = self.conv(ann)
            kw: dict[str, Any] = {"alias": f.alias} if f.alias and f.alias != name else {}
            fields[name] = (ann, Field(... if f.is_required() else f.default, **kw))
        new = create_model(cls.__name__, __config__=ConfigDict(extra="forbid"), **fields)
        self._models[cls] = new
        self.model_names.add(cls.__name__)
        return new


def _typeddict_model(td: type) -> type[BaseModel]:
    """Pydantic model for a TypedDict param.  ``__required_keys__`` is wrong for
    the openai params (string annotations), so read ``Required[...]`` directly."""
    fields: dict[str, Any] = {}
    for k, v in typing.get_type_hints(td, include_extras=True).items():
        required = get_origin(v) in (typing.Required, typing_extensions.Required) or k in td.__required_keys__
        if get_origin(v) in (typing.Required, typing.NotRequired, typing_extensions.Required, typing_extensions.NotRequired):
            v = get_args(v)[0]
        fields[k] = (v, ... if required else None)
    return create_model(td.__name__.removesuffix("Param"), **fields)


@functools.lru_cache(maxsize=1)
def _build() -> tuple[TypeAdapter, TypeAdapter, _Rebuilder]:
    from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent
    from openai.types.realtime.conversation_item import ConversationItem
    from openai.types.realtime.realtime_response_create_params import RealtimeResponseCreateParams
    from openai.types.realtime.realtime_session_create_request import RealtimeSessionCreateRequest
    from openai.types.realtime.realtime_transcription_session_create_request import (
        RealtimeTranscriptionSessionCreateRequest,
    )
    from openai.types.realtime.response_item_reference_param import ResponseItemReferenceParam
    from openai.types.realtime.session_created_event import SessionCreatedEvent
    from openai.types.realtime.session_updated_event import SessionUpdatedEvent

    rb = _Rebuilder()
    item_ref = _typeddict_model(ResponseItemReferenceParam)
    rb.overrides[(RealtimeResponseCreateParams, "input")] = Optional[
        List[Union[(*get_args(get_args(ConversationItem)[0]), item_ref)]]
    ]

    # Server-side session objects carry id / object / expires_at (absent from
    # the models).  Optional to send (default not validated), but an explicit
    # null is rejected.
    extras: dict[str, Any] = {
        "id": (str, Field(default=None)),
        "object": (Literal["realtime.session", "realtime.transcription_session"], Field(default=None)),
        "expires_at": (int, Field(default=None)),
    }
    srv_sessions = [
        create_model(base.__name__, __base__=base, **extras)
        for base in (RealtimeSessionCreateRequest, RealtimeTranscriptionSessionCreateRequest)
    ]
    for ev in (SessionCreatedEvent, SessionUpdatedEvent):
        rb.overrides[(ev, "session")] = Union[tuple(srv_sessions)]

    client = TypeAdapter(rb.conv(RealtimeClientEvent))
    server = TypeAdapter(rb.conv(RealtimeServerEvent))
    return client, server, rb


def _fmt_path(loc: tuple[Any, ...], model_names: set[str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        s = str(part)
        if s.startswith("<") or "[" in s or s in model_names or s in {"str", "int", "float", "bool", "none"}:
            continue  # union-member labels, not JSON keys
        out += f".{s}" if out else s
    return out


_KIND = {
    "extra_forbidden": "unknown_parameter",
    "missing": "missing_required_parameter",
    "union_tag_invalid": "invalid_value",
    "union_tag_not_found": "missing_required_parameter",
}


def _validate(event: Any, which: str) -> None:
    client, server, rb = _build()
    adapter = client if which == "client" else server
    if not isinstance(event, dict):
        raise SchemaViolation(f"{which} event must be a JSON object, got {type(event).__name__}")
    etype = event.get("type")
    if not isinstance(etype, str):
        raise SchemaViolation(f"{which} event without a string 'type': {event!r:.120}",
                              path="type", kind="missing_required_parameter")
    try:
        adapter.validate_python(event, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        top = [e for e in errors if not e["loc"] and e["type"].startswith("union_tag")]
        if top:
            hint = f" (beta name; GA uses {_BETA_HINTS[etype]!r})" if etype in _BETA_HINTS else ""
            raise SchemaViolation(f"unknown {which} event type {etype!r}{hint}",
                                  event_type=etype, path="type", kind="unknown_event_type") from None
        # Most specific first: unknown keys, then the deepest location.
        errors.sort(key=lambda e: (e["type"] != "extra_forbidden", -len(e["loc"])))
        lines = []
        for e in errors:
            path = _fmt_path(e["loc"], rb.model_names) or "<event>"
            if e["type"] == "extra_forbidden":
                msg = f"unknown key {str(path).rsplit('.', 1)[-1]!r}"
            elif e["type"] == "union_tag_invalid":
                msg = f"unknown type {e['ctx']['tag']!r} (expected one of {e['ctx']['expected_tags']})"
            elif e["type"] == "missing":
                path, _, key = path.rpartition(".")
                path, msg = path or "<event>", f"missing required key {key!r}"
            elif e["type"] == "union_tag_not_found":
                msg = "missing or invalid 'type'"
            else:
                msg = f"{e['msg']} (got {e['input']!r:.60})"
            line = f"{path}: {msg}"
            if line not in lines:
                lines.append(line)
        first = errors[0]
        more = "".join(f"\n  also: {ln}" for ln in lines[1:6])
        raise SchemaViolation(
            f"{which} event {etype!r}: {lines[0]}{more}",
            event_type=etype,
            path=_fmt_path(first["loc"], rb.model_names),
            kind=_KIND.get(first["type"], "invalid_value"),
        ) from None


def prepare() -> None:
    """Build the validators now (importing `openai` and rebuilding its event unions: seconds of CPU on a
    busy machine), not inside the first event's check, where a fake server would stall mid-call."""
    _build()


def validate_client_event(event: dict) -> None:
    """Raise SchemaViolation unless ``event`` is a valid GA client event."""
    _validate(event, "client")


def validate_server_event(event: dict) -> None:
    """Raise SchemaViolation unless ``event`` is a valid GA server event."""
    _validate(event, "server")
