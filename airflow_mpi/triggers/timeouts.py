"""``asyncio.timeout`` on every Python the package declares (3.10 to 3.13): the deferred wait
bounds its reads with it.

3.10 has none: there the ``async-timeout`` package (a dependency on 3.10 only; ``asyncio.timeout``
was taken from it) stands in, made to raise the builtin ``TimeoutError`` as 3.11's does (on 3.10
``asyncio.TimeoutError`` is another class) and to answer ``expired()`` as a method. The
compatibility tier runs this on 3.10 (``tests/cluster/release_check.py pycompat``).
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType

if sys.version_info >= (3, 11):
    from asyncio import Timeout as Timeout
    from asyncio import timeout as timeout_after
else:  # pragma: no cover (run by the compatibility tier on 3.10)
    import async_timeout

    class Timeout:
        """``asyncio.Timeout`` of 3.11 for 3.10, over ``async_timeout.Timeout``."""

        def __init__(self, delay: float | None) -> None:
            self._inner = async_timeout.timeout(delay)

        async def __aenter__(self) -> Timeout:
            await self._inner.__aenter__()
            return self

        async def __aexit__(
            self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
        ) -> bool | None:
            try:
                suppressed: bool | None = await self._inner.__aexit__(kind, error, trace)
                return suppressed
            except asyncio.TimeoutError as expired:
                raise TimeoutError from expired

        def expired(self) -> bool:
            return bool(self._inner.expired)

    def timeout_after(delay: float | None) -> Timeout:
        return Timeout(delay)


__all__ = ["Timeout", "timeout_after"]
