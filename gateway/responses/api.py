"""POST /v1/responses, top to bottom, on the chat path's stages (gateway.pipeline):

    authenticate → validate → the previous response's conversation (this tenant's) → translate to
    a chat request (litellm's bridge) → pick the model, allowlist, route, admit → screen input
    → cache → call the chain (stream or not; screened, escalated, billed, cached as chat is)
    → store the response (unless `store: false`; while the ledger is handed off, both awaited
    before the client has the response or a stream's last event) → respond in the Responses dialect

The same admission, limits, budgets, screening, cache, breakers, failover and ledger as chat
completions, because it is the chat request that runs: only the edges speak Responses. The
conversation a `previous_response_id` continues is stored as chat messages, so any deployment of
any format can take the next turn.

GET /v1/responses/{id}, DELETE it, and its input_items are Django views (gateway.responses.views).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson

from billing.money import ZERO
from gateway.cache import engine as cache
from gateway.call import Call, Reply, both, request_id_from
from gateway.knowledge import grounding
from gateway.pipeline import (
    admit,
    answer_from_chain,
    answered,
    consult_cache,
    identify,
    pick_model,
    record_hit,
    route_and_admit,
)
from gateway.relay import stream_from_chain
from gateway.responses import store
from gateway.responses.render import (
    ResponsesEvents,
    Shape,
    assistant_message,
    cite,
    file_search_item,
    message_item,
    new_id,
    response_from_completion,
    status_of,
    usage_of,
)
from gateway.responses.schemas import ResponsesRequest, parse_responses_request
from gateway.responses.translate import chat_request, input_items, turn_messages
from gateway.screening import engine as screening
from gateway.upstream.transport import Event

log = logging.getLogger(__name__)


class Turn:
    """One request's response: its shape, and how it is kept for a next turn."""

    def __init__(
        self,
        call: Call,
        request: ResponsesRequest,
        body: dict,
        prelude: list[dict] | None = None,
        sources: list | None = None,
    ) -> None:
        self.call = call
        self.shape = Shape(new_id("resp"), request, body, store=request.store is not False)
        self.prelude = prelude or []  # output items before the model's (a file_search_call)
        self.sources = sources or []  # the passages it gave, which the answer's [n] markers cite
        self.items = input_items(body["input"])
        self.system = 1 if request.instructions else 0
        self.body = b""  # the Response as sent, once rendered (answer)

    async def answer_completion(self, completion: dict) -> None:
        """A chat completion as this turn's Response, serialized and kept (answer)."""
        response = response_from_completion(self.shape, completion)
        cite(response["output"], self.sources)
        response["output"] = [*self.prelude, *response["output"]]
        await self.answer(response)

    async def answer(self, response: dict) -> None:
        """This turn's Response serialized once (self.body), for the client and the store, and kept."""
        self.body = orjson.dumps(response)
        await self.keep(response, self.body)

    async def keep(self, response: dict, serialized: bytes | None = None) -> None:
        """Stored before the client has it, unless it asked not to be. A database that refuses the
        write does not take the paid-for answer from the client: the failure is logged, and the
        response cannot be continued or read back."""
        if not self.shape.store:
            return
        call = self.call
        conversation = [*call.body["messages"][self.system :], assistant_message(response["output"])]
        try:
            await store.response_save(
                tenant_id=call.key.tenant_id,
                key_id=call.key.key_id,
                response_id=self.shape.response_id,
                request_id=call.request_id,
                response=serialized or response,
                input_items=self.items,
                conversation=conversation,
            )
        except Exception:
            log.exception("response %s of request %s was not stored", self.shape.response_id, call.request_id)


async def create(headers, raw_body: bytes) -> Reply:
    call = Call(request_id=request_id_from(headers.get("x-sentinel-request-id")))
    return await answered(call, lambda: _create(call, headers, raw_body))


async def _create(call: Call, headers, raw_body: bytes) -> Reply:
    call.key = await identify(headers, None)
    request, body, file_search = parse_responses_request(raw_body)
    history: list[dict] = []
    if request.previous_response_id:
        previous = await store.response_get(
            tenant_id=call.key.tenant_id, response_id=request.previous_response_id, param="previous_response_id"
        )
        history = previous.conversation
    messages, params = turn_messages(request, body)
    call.request, call.body = chat_request(request, body, history, messages, params)
    call.cache_controls = cache.controls_from(call.body, headers)
    prelude, sources = [], []
    if file_search is not None:  # the tenant's passages, before the prompt is counted (as grounded chat)
        asked, param = file_search
        grounded = await grounding.ground(call, asked, param=param)
        if grounded is not None:
            with_results = "file_search_call.results" in (request.include or ())
            prelude.append(file_search_item(grounded.query, grounded.hits, with_results=with_results))
            sources = grounded.hits
    route, chain = await route_and_admit(call, headers, None, model_of=pick_model, admit_with=admit)
    await screening.screen_input(call)  # may block, or redact call.body before the cache sees it
    turn = Turn(call, request, body, prelude, sources)
    hit = await consult_cache(call, route)
    if hit is not None:
        return await serve_from_cache(call, hit, turn)
    if request.stream:
        return await stream_from_chain(call, chain, ResponsesEvents(turn.shape, turn.keep, turn.prelude, turn.sources))
    # Rendered and stored as soon as the answer is final, while the ledger is handed off.
    _, headers = await answer_from_chain(call, chain, alongside=turn.answer_completion)
    return Reply(200, headers, turn.body)


async def serve_from_cache(call: Call, hit: cache.Hit, turn: Turn) -> Reply:
    """A cached answer (the chat path's: its text), as a Response or replayed as its events."""
    answer = hit.answer
    if not call.request.stream:
        output = [message_item(new_id("msg"), answer.get("content") or "", None)]
        status = status_of(answer.get("finish_reason"))
        usage = usage_of(answer.get("usage") or {})
        response = turn.shape.response(status=status, model=answer.get("model", ""), output=output, usage=usage)
        # Stored while the hit is recorded (the ledger's hand-off): two round trips at once.
        headers, _ = await both(record_hit(call, hit), turn.answer(response))
        return Reply(200, headers, turn.body)
    headers = await record_hit(call, hit)
    headers["content-type"] = "text/event-stream"
    headers["cache-control"] = "no-cache"
    return Reply(200, headers, stream=replay(ResponsesEvents(turn.shape, turn.keep), answer))


async def replay(events: ResponsesEvents, answer: dict) -> AsyncIterator[bytes]:
    delta = {"content": answer.get("content") or ""}
    choice = {"delta": delta, "finish_reason": answer.get("finish_reason")}
    chunk = {"model": answer.get("model", ""), "choices": [choice]}
    yield events.chunk(Event(chunk))
    yield await events.end(ZERO, answer)
