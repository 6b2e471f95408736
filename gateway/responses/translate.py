"""A Responses request as the chat request the pipeline runs, through litellm's bridge
(LiteLLMCompletionResponsesConfig: input items to messages, function tools, tool_choice,
text.format to response_format, reasoning to reasoning_effort), and its input items as stored."""

from __future__ import annotations

from litellm.responses.litellm_completion_transformation.transformation import LiteLLMCompletionResponsesConfig
from pydantic import ValidationError

from gateway.errors import invalid_request
from gateway.responses.render import new_id
from gateway.responses.schemas import ResponsesRequest
from gateway.schemas import ChatRequest, validation_error

# What litellm's bridge answers with that is a chat request's parameter.
TRANSLATED = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_tokens",
    "user",
    "service_tier",
    "safety_identifier",
    "response_format",
    "reasoning_effort",
)
# The Responses request's fields a chat request takes as they are.
AS_SENT = (
    "metadata",
    "moderation",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "cache",
)
# What the bridge reads from the request (the instructions are put first here, ahead of history).
BRIDGED = ("tools", "tool_choice", "text", "reasoning", "top_p", "user", "temperature", "parallel_tool_calls")


# Parameters the bridge only renames (or keeps): a text input with only these needs no bridge.
PLAIN = {"temperature": "temperature", "top_p": "top_p", "user": "user", "max_output_tokens": "max_tokens"}


def turn_messages(request: ResponsesRequest, body: dict) -> tuple[list[dict], dict]:
    """This turn's input as chat messages, and the chat parameters the request translates to."""
    params = {name: body[name] for name in BRIDGED if name in body}
    if request.max_output_tokens is not None:
        params["max_output_tokens"] = request.max_output_tokens
    if isinstance(body["input"], str) and params.keys() <= PLAIN.keys():
        # The common case, as the bridge translates it (a test holds the two equal), without its
        # 0.14 ms of pydantic work.
        chat = {PLAIN[name]: value for name, value in params.items() if value is not None}
        return [{"role": "user", "content": body["input"]}], chat
    return bridged(request, body, params)


def bridged(request: ResponsesRequest, body: dict, params: dict) -> tuple[list[dict], dict]:
    try:
        translated = LiteLLMCompletionResponsesConfig.transform_responses_api_request_to_chat_completion_request(
            model=request.model,
            input=body["input"],
            responses_api_request=params,
            custom_llm_provider="openai",  # the chain's deployments translate from OpenAI's format
            stream=request.stream,
        )
    except Exception as exc:  # noqa: BLE001 - whatever litellm refuses, the input is at fault
        raise invalid_request(f"The input could not be translated: {exc}", param="input") from None
    messages = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in translated["messages"]]
    chat = {name: translated[name] for name in TRANSLATED if translated.get(name) is not None}
    return messages, chat


def chat_request(
    request: ResponsesRequest, body: dict, history: list[dict], messages: list[dict], params: dict
) -> tuple[ChatRequest, dict]:
    """The chat request the pipeline runs: instructions, the conversation so far, this turn."""
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    chat = {"model": request.model, "messages": [*system, *history, *messages], "stream": request.stream, **params}
    chat.update({name: body[name] for name in AS_SENT if name in body})
    verbosity = (request.text.verbosity if request.text else None) or None
    if verbosity:
        chat["verbosity"] = verbosity
    try:
        return ChatRequest.model_validate(chat), chat
    except ValidationError as exc:
        raise validation_error(exc) from None


def input_items(value: str | list[dict]) -> list[dict]:
    """This turn's input as OpenAI lists it (GET /v1/responses/{id}/input_items): typed items with
    ids, a message's text as content parts."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    items = []
    for item in value:
        kind = item.get("type") or "message"
        if kind == "message":
            content = item["content"]
            if isinstance(content, str):
                part = "output_text" if item["role"] == "assistant" else "input_text"
                content = [{"type": part, "text": content}]
            items.append(
                {"id": item.get("id") or new_id("msg"), "type": "message", "role": item["role"], "content": content}
                | {"status": item.get("status") or "completed"}
            )
        else:
            prefix = "fc" if kind == "function_call" else "fco"
            items.append({**item, "id": item.get("id") or new_id(prefix), "status": item.get("status") or "completed"})
    return items
