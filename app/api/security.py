"""Who may call what. Bearer keys, optional: with none configured the API is open
(the local demo). `api` keys open the OpenAI routes, `/v1/models` and `/engines`;
`admin` keys open those and the routes that change the gateway's state
(`POST /admin/...`). Keys are compared in constant time. `/health` and `/ready`
stay open for probes; `/metrics` is open, behind a key (`metrics_require_key`),
or only on its own port (`metrics_port`). CORS is off unless origins are set.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware

from app.api.errors import APIError
from app.config import Settings
from app.routing import METHOD_HEADER


class AuthenticationError(APIError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDeniedError(APIError):
    status = 403
    type = "invalid_request_error"
    code = "insufficient_scope"


@dataclass(frozen=True)
class Keys:
    api: frozenset[str]
    admin: frozenset[str]

    @staticmethod
    def from_settings(settings: Settings) -> Keys:
        return Keys(settings.keys("api"), settings.keys("admin"))

    @property
    def open(self) -> bool:
        return not self.api and not self.admin


def _matches(presented: str, keys: frozenset[str]) -> bool:
    # Every key is compared, so the time taken does not say which one came close.
    found = False
    for key in keys:
        found |= hmac.compare_digest(presented.encode(), key.encode())
    return found


def _bearer(request: Request) -> str:
    anthropic = request.headers.get("x-api-key", "").strip()  # how Anthropic's clients send their key
    if anthropic and "authorization" not in request.headers:
        return anthropic
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError(
            "You didn't provide an API key: send it as 'Authorization: Bearer <key>'.",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token.strip()


def _keys(request: Request) -> Keys:
    keys: Keys = request.app.state.keys
    return keys


def check_api_key(request: Request) -> None:
    keys = _keys(request)
    if keys.open:
        return
    token = _bearer(request)
    if not (_matches(token, keys.api) or _matches(token, keys.admin)):
        raise AuthenticationError("Incorrect API key provided.", headers={"WWW-Authenticate": "Bearer"})


# The dependencies are coroutines: FastAPI runs a plain function dependency in a worker
# thread, a thread hop per request for a check of a few microseconds.
async def require_api_key(request: Request) -> None:
    check_api_key(request)


async def require_admin_key(request: Request) -> None:
    keys = _keys(request)
    if not keys.admin:
        raise PermissionDeniedError("Admin routes are off: no admin keys are configured.")
    token = _bearer(request)
    if _matches(token, keys.admin):
        return
    if _matches(token, keys.api):
        raise PermissionDeniedError("This key may not use admin routes.")
    raise AuthenticationError("Incorrect API key provided.", headers={"WWW-Authenticate": "Bearer"})


async def require_metrics_key(request: Request) -> None:
    settings: Settings = request.app.state.gateway.settings
    if settings.metrics_require_key:
        check_api_key(request)


def install_security(app: FastAPI, settings: Settings) -> None:
    app.state.keys = Keys.from_settings(settings)
    origins = [o.strip() for o in (settings.cors_origins or "").split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", METHOD_HEADER],
            expose_headers=[METHOD_HEADER, "X-Specgate-Engine", "Retry-After"],
        )
