"""What every config section is built from: the error that names a key, the frozen strict base
section, and the field types numbers as people write them need (``1e6`` as an integer)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


class ConfigError(ValueError):
    """Bad input (a config, override, sweep axis or option); the message names the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Finite = dict(allow_inf_nan=False)


def doc(meaning: str, units: str = "") -> dict[str, Any]:
    """A field's metadata, the one place a key's meaning and units are written: the
    configuration reference (``fastsim keys``, docs/configuration.md) and the datasets' coordinate
    units read it. Spread into ``Field(...)``."""
    return {"description": meaning, "json_schema_extra": {"units": units}}


LARGEST = 2**53
"""The largest whole number a config holds (9.0e15): every integer up to it is exact as a float
(``1e15`` is read exactly) and fits the kernels' 64-bit counters with room for sums."""


def _integral(value: Any) -> Any:
    """``1e6`` (a float that is exactly a whole number) becomes ``1000000``; anything else is
    left for the strict integer check (so ``1.5`` and booleans are still refused). Whole numbers
    beyond :data:`LARGEST` either way are refused."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST:
        raise ValueError(f"{value:.3g} is beyond the largest whole number a config holds (2^53, {LARGEST:.2g})")
    return value


Int = Annotated[int, BeforeValidator(_integral)]
