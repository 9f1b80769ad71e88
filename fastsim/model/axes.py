"""How a sweep grid validates its axes' values (which keys may be axes, and the dimension each
becomes, are :mod:`.schema`'s rules): by the section that checks its fields together, where a
point then takes the section whole, or in one call for a plain field."""

from __future__ import annotations

from typing import Annotated, Any, Callable

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from .schema import OPTIONAL_SECTIONS, SAME_THING, Config, _config_error, get_dotted, inside_optional


def coupled_section(key: str) -> str | None:
    """The outermost section above ``key`` that checks its fields together (has a model
    validator: a preset, or min <= max), or None. Sweep axes in the same coupled section are
    validated in combination, and a point takes that section whole from the validated
    combination; any other axis is validated value by value, so a grid's set-up work grows
    with its axes' lengths, not with their product."""
    inside = inside_optional(key)
    if inside is not None:  # validated with the rest of its section, which a point takes whole
        return inside
    parts = key.split(".")
    cls: type[BaseModel] = Config
    for depth, part in enumerate(parts[:-1]):
        cls = cls.model_fields[part].annotation
        if cls.__pydantic_decorators__.model_validators:
            return ".".join(parts[: depth + 1])
    return None


def section_validator(base: Config, section: str) -> Callable[[dict[str, Any]], BaseModel]:
    """A function that validates ``base``'s section ``section`` with dotted keys (all under that
    section) set to given values, alone, and returns it; errors name the full key. The base
    section is read once, so validating many values costs one pydantic validation each."""
    node = get_dotted(base, section) if section else base
    if node is None:  # an optional section the base leaves null: from its defaults, as --set does
        raw, cls = {}, OPTIONAL_SECTIONS[section]
    else:
        raw, cls = node.model_dump(exclude_unset=True), type(node)
    skip = len(section) + 1 if section else 0

    def validate_with(values: dict[str, Any]) -> BaseModel:
        top = dict(raw)
        for key, value in values.items():
            *path, leaf = key[skip:].split(".")
            if section == "model" and not path and leaf in SAME_THING:
                top.pop(SAME_THING[leaf], None)
            d = top
            for part in path:  # copy the nested sections on the way, never the base's
                d[part] = dict(d.get(part) or {})
                d = d[part]
            d[leaf] = value
        try:
            return cls.model_validate(top)
        except ValidationError as exc:
            raise _config_error(exc, section) from None

    return validate_with


def axis_validator(base: Config, key: str) -> Callable[[list], list] | None:
    """A function that validates every value of a sweep axis ``key`` in one call and returns
    them as :func:`section_validator` leaves them one at a time (``1e3`` becomes ``1000``), for
    a field with no validator of its own in a section with none across fields (then the other
    fields cannot change a value's fate); None for any other field. Its ConfigError does not
    name the value: validate a refused axis value by value for that."""
    section, leaf = key.rsplit(".", 1) if "." in key else ("", key)
    cls = type(get_dotted(base, section) if section else base)
    field = cls.model_fields.get(leaf)
    decorators = cls.__pydantic_decorators__
    own = any({leaf, "*"} & set(d.info.fields) for d in decorators.field_validators.values())
    if field is None or own or decorators.model_validators or decorators.root_validators:
        return None
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
        return None
    one = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    adapter = TypeAdapter(list[one], config=ConfigDict(strict=cls.model_config.get("strict", False)))

    def validate_all(values: list) -> list:
        try:
            return adapter.validate_python(values)
        except ValidationError as exc:
            raise _config_error(exc, key) from None

    return validate_all


