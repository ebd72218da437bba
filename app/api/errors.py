"""One small error tree, rendered as OpenAI's error body
`{"error": {"message", "type", "param", "code"}}`. Internal exception text is
never sent: unexpected errors become a generic 500.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.engines.base import EngineInputError, EngineTimeoutError, EngineUnavailableError

logger = logging.getLogger(__name__)


class APIError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}
        if code is not None:
            self.code = code

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def sse(self) -> str:
        """The error as one SSE event, for a stream that has already started."""
        return f"data: {json.dumps(self.body())}\n\n"


class BadRequestError(APIError):
    status = 400
    type = "invalid_request_error"


class NotFoundError(APIError):
    status = 404
    type = "invalid_request_error"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class MethodNotAllowedError(APIError):
    status = 405
    type = "invalid_request_error"


class OverloadedError(APIError):
    status = 429
    type = "rate_limit_error"
    code = "engine_overloaded"


class ServiceUnavailableError(APIError):
    status = 503
    type = "service_unavailable"


class GatewayTimeoutError(APIError):
    status = 504
    type = "timeout_error"


def api_error_for(exc: BaseException) -> APIError:
    """The client-facing error for an engine failure; never the internal text
    of an unexpected exception."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineInputError):
        return BadRequestError(str(exc))
    if isinstance(exc, EngineUnavailableError):
        return ServiceUnavailableError(str(exc))
    if isinstance(exc, EngineTimeoutError):
        return GatewayTimeoutError(str(exc))
    return APIError("The server had an error while processing the request.")


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        msg = "Unrecognized request argument supplied"
    text = f"{param}: {msg}" if param else msg
    return text, param


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = _validation_message(exc)
    return error_response(BadRequestError(message, param=param))


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error: APIError
    if exc.status_code == 404:
        error = NotFoundError(f"No route for {request.method} {request.url.path}.")
    elif exc.status_code == 405:
        error = MethodNotAllowedError(f"Method {request.method} is not allowed here.")
    else:
        error = APIError(str(exc.detail))
        error.status = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return error_response(error)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(APIError("The server had an error while processing the request."))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)
