"""OpenAI request specs: parsing, errors and token estimates. No I/O."""

from extproc.openai.errors import ApiError
from extproc.openai.spec import (
    Api,
    BodyLimits,
    InferenceRequest,
    api_for_path,
    cap_output_tokens,
    decode_json,
    parse_document,
    parse_request,
    request_user,
    requested_model,
    rewrite_body,
)
from extproc.openai.tokens import estimate_tokens

__all__ = ["Api", "ApiError", "BodyLimits", "InferenceRequest", "api_for_path", "cap_output_tokens", "decode_json",
           "estimate_tokens", "parse_document", "parse_request", "request_user", "requested_model", "rewrite_body"]
