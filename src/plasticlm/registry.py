"""One registry per extension point: the only place its members are listed.

A member is added by one decorated class (or function) in one file, like PEFT's
``register_peft_method``::

    AGGREGATORS = Registry("aggregation rule")

    @AGGREGATORS.register("median")
    class Median: ...

A config field names a member with ``Annotated[str, AGGREGATORS.key]``: a typo is refused
when the config is loaded, with the valid names listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from pydantic import AfterValidator

from plasticlm.errors import PlasticError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named members of one extension point, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._members: dict[str, T] = {}
        # for config fields: Annotated[str, registry.key] checks membership at load
        self.key = AfterValidator(self._validate)

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator adding a class or function under ``name`` (names are unique)."""
        def add(member: T) -> T:
            if name in self._members:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._members[name] = member
            return member
        return add

    def check(self, name: str) -> str:
        """``name`` if registered, else a refusal naming the valid members."""
        if name not in self._members:
            raise PlasticError(f"unknown {self.kind} {name!r}; choose one of "
                               f"{', '.join(self._members)}")
        return name

    def _validate(self, name: str) -> str:
        if name not in self._members:   # pydantic adds the key's place to a ValueError
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of "
                             f"{', '.join(self._members)}")
        return name

    def __getitem__(self, name: str) -> T:
        return self._members[self.check(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def names(self) -> tuple[str, ...]:
        return tuple(self._members)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._members.items())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._members)})"
