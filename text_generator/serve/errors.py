"""APIError: a refused HTTP request, rendered as OpenAI's error body.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": "TG_INVALID_REQUEST"}}

`code` is a text_generator.errors.ErrorCode value (the project's one enum); `type` follows
OpenAI's names; `param` names the request field at fault (None when no single field is).
"""

from __future__ import annotations

from text_generator.errors import ErrorCode

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
          500: "internal_server_error", 503: "service_unavailable_error"}


class APIError(Exception):
    def __init__(self, status: int, code: ErrorCode, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "api_error"),
                          "param": self.param, "code": self.code.value}}


def bad_request(message: str, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> APIError:
    return APIError(400, code, message, param)
