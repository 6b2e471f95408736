"""OpenAI's Responses API (/v1/responses) as a dialect of the chat pipeline (gateway.pipeline)."""
