"""A tiny name -> function registry, so variants are selected by lookup instead of if/elif chains.

Every algorithm area (advantage estimators, policy losses, KL estimators, off-policy corrections,
aggregations) keeps one ``Registry``. Config code names a variant with a typed ``Literal`` string; user
code may instead pass its own callable with the same signature, and ``get`` hands it back unchanged.

Each area's names are a :class:`VariantNames` table apart from its functions (:mod:`rlkit.algorithms.params`), so
that the config layer validates a name without importing the functions, which import torch. The registry built
over a table refuses to register a name outside it, and a test holds the two equal.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar, Union

from rlkit.errors import RLKitError

F = TypeVar("F", bound=Callable)


class UnknownVariantError(RLKitError, KeyError, ValueError):
    """A variant name that no registry entry has. The message lists the available names."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message, quotes and all
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class VariantNames:
    """The names one registry holds, and what an entry is called in messages ("advantage estimator")."""

    kind: str
    names: tuple[str, ...]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def unknown_message(self, name: object) -> str:
        """``unknown <kind> 'x' (did you mean 'y'?); available: 'a', 'b', 'y'``."""
        available = ", ".join(repr(n) for n in self.names)
        close = [n for n in self.names if n.startswith(str(name))] if name else []
        close = close or difflib.get_close_matches(str(name), self.names, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; available: {available}"


class Registry(Generic[F]):
    """Maps names to functions of one signature.

    >>> losses = Registry("policy loss")
    >>> @losses.register("reinforce")
    ... def reinforce(logprobs, old_logprobs, advantages, mask, params): ...
    >>> losses.get("reinforce") is reinforce
    True
    """

    def __init__(self, kind: Union[str, VariantNames]):
        self.table = kind if isinstance(kind, VariantNames) else None  # the names it may hold (None: any)
        self.kind = kind.kind if isinstance(kind, VariantNames) else kind  # what an entry is, for messages
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: add ``fn`` under ``name``. Registering a name twice, or one its table lacks, is an error."""
        if self.table is not None and name not in self.table:
            raise ValueError(f"{self.kind} {name!r} is not in the registry's name table {self.table.names}: "
                             "add it there (rlkit.algorithms.params) so that the config accepts it")

        def add(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._entries[name]!r})")
            self._entries[name] = fn
            return fn

        return add

    def get(self, name_or_fn: Union[str, F]) -> F:
        """The function registered as ``name_or_fn``, or ``name_or_fn`` itself when it is a callable."""
        if callable(name_or_fn):
            return name_or_fn
        try:
            return self._entries[name_or_fn]
        except (KeyError, TypeError):
            raise UnknownVariantError(self.unknown_message(name_or_fn)) from None

    def unknown_message(self, name: object) -> str:
        """``unknown <kind> 'x' (did you mean 'y'?); available: 'a', 'b', 'y'`` (the registered names)."""
        return VariantNames(self.kind, self.names()).unknown_message(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
