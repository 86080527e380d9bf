"""Golden names within one test: given, or the call's position among the unnamed calls."""

from __future__ import annotations

from .._errors import PrecisionInputError

AUTO_NAME = "#"


class GoldenNames:
    """The names a test (or its float64 rerun) used, in order; each name is used once."""

    def __init__(self, test_id: str) -> None:
        self.test_id = test_id
        self.used: set[str] = set()
        self.order: list[str] = []
        self._unnamed = 0

    def take(self, name: str | None) -> str:
        """``name``, or ``#N`` for the N-th unnamed call; refuses a repeated or reserved name."""
        if name is None:
            name = f"{AUTO_NAME}{self._unnamed}"
            self._unnamed += 1
        elif not isinstance(name, str) or not name or name.startswith(AUTO_NAME):
            raise PrecisionInputError(
                f"golden name must be a non-empty string not starting with {AUTO_NAME!r}, "
                f"not {name!r}"
            )
        if name in self.used:
            raise PrecisionInputError(
                f"golden name {name!r} is used twice in {self.test_id}; names must be unique "
                "within a test"
            )
        self.used.add(name)
        self.order.append(name)
        return name

    def position(self, name: str) -> int:
        return self.order.index(name) if name in self.order else 0
