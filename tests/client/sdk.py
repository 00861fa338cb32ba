"""The real ``openai`` SDK over a hedging transport, as the client tests build it (typed once).

The SDK's annotations name ``httpx2`` clients only, while it takes an ``httpx`` client too (it
checks for either at run time); the one targeted ``type: ignore`` for that lives here.
"""

from __future__ import annotations

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

#: The conversation the SDK tests send.
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
#: The SDK's base URL: the transport routes every request to its upstreams, so no host is reached.
BASE_URL = "http://hedgerow.invalid/v1"


def async_sdk(
    transport: httpx.AsyncBaseTransport, *, base_url: str = BASE_URL, api_key: str = "caller-key"
) -> openai.AsyncOpenAI:
    """An ``openai.AsyncOpenAI`` sending through ``transport`` (an ``httpx.AsyncClient``), no SDK retries.

    Args:
        transport: the app's transport (a ``HedgingTransport``, or one under test).
        base_url: the SDK's base URL.
        api_key: the key the SDK sends (the caller's key).
    """
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
    )


def sync_sdk(transport: httpx.BaseTransport, *, base_url: str = BASE_URL, api_key: str = "caller-key") -> openai.OpenAI:
    """An ``openai.OpenAI`` sending through ``transport`` (an ``httpx.Client``), no SDK retries.

    Args:
        transport: the app's transport (a ``HedgingTransport``, or one under test).
        base_url: the SDK's base URL.
        api_key: the key the SDK sends (the caller's key).
    """
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
    )
