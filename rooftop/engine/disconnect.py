"""Racing a reply against its client's disconnect, for replies sent only once they are whole."""

import asyncio
import contextlib
from collections.abc import Awaitable

from fastapi import Request
from fastapi.responses import Response

CLIENT_GONE = 499  # the status of a reply nobody reads (nginx's "client closed request")


async def until_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """What `work` answers, unless the client disconnects first: then work is cancelled (a request's event
    stream closes and aborts it in the engine, freeing its slot and pages) and the reply is an empty 499.

    A non-streamed reply is sent only at the end, so nothing else notices a client that left: the request
    would hold its slot and KV pages until max_tokens and count as finished by length."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler is cancelled itself (the server stops): so is the work
        task.cancel()
        gone.cancel()
        raise
    gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return Response(status_code=CLIENT_GONE)


async def _disconnect(request: Request) -> None:
    """Return once the client has closed its connection (the body has been read: only that comes now)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
