"""The served model's tokenizer, asked over HTTP: POST /tokenize with vLLM's request shapes (a `prompt`, or
`messages` rendered through the server's chat template) and its response's `tokens`. So an HTTP replay
turns text (ShareGPT messages) into the ids the server's own tokenizer and template give, without a
tokenizer on the client. Works with this server, its router and vLLM."""

from __future__ import annotations

from experiments.traces.types import TraceError


class ServerTokenizerError(TraceError):
    """The server could not tokenize (no /tokenize route, no tokenizer or template, a refused body)."""


class ServerTokenizer:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60.0):
        import httpx

        self.url = base_url.rstrip("/").removesuffix("/v1") + "/tokenize"
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ServerTokenizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tokens(self, body: dict) -> list[int]:
        import httpx

        try:
            r = self.client.post(self.url, json={"model": self.model, **body})
        except httpx.HTTPError as e:
            raise ServerTokenizerError(f"{type(e).__name__}: {e}", self.url) from e
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code != 200:
            error = data.get("error") if isinstance(data, dict) else None
            message = error.get("message") if isinstance(error, dict) else r.text[:300]
            missing = r.status_code == 404 and not isinstance(error, dict)  # no such route
            hint = " (the server has no /tokenize: vLLM's tokenizer endpoint is needed)" if missing else ""
            raise ServerTokenizerError(f"HTTP {r.status_code}: {message}{hint}", self.url)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ServerTokenizerError(f"the answer has no list of token ids: {r.text[:200]}", self.url)
        return tokens

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokens({"prompt": text, "add_special_tokens": add_special_tokens})

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]:
        return self._tokens(
            {
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "continue_final_message": continue_final_message,
                "add_special_tokens": False,
            }
        )
