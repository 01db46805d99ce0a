"""OpenAI request specs: parsing, errors and token estimates. No I/O."""

from extproc.openai.errors import ApiError
from extproc.openai.spec import Api, InferenceRequest, api_for_path, cap_output_tokens, parse_request, rewrite_body
from extproc.openai.tokens import estimate_tokens

__all__ = ["Api", "ApiError", "InferenceRequest", "api_for_path", "cap_output_tokens", "estimate_tokens",
           "parse_request", "rewrite_body"]
