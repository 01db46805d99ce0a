"""Building blocks shared by every section of the policy file (and the tenants keys file), one definition each.

- `Strict`: the base of every model. Unknown keys are errors (a typo never silently falls back to a default);
  frozen, so a loaded policy is an immutable snapshot every request in flight can share.
- `PoolName`, `ClassName`, `RuleName`: what the operator names pools, priority classes and guard rules, under
  one rule. A pool name becomes an Envoy cluster name and part of a file name (`eds-<pool>.yaml`); every one of
  them is a metric label value. So: lower-case letters, digits, `_`, `.` and `-`, starting and ending with a
  letter or digit, at most 63 characters (a DNS label's bound, which Kubernetes object names share).
- `HeaderName`: an HTTP header name the service reads or sets. Lower case, because Envoy hands ext_proc every
  header name lower-cased (HTTP/2 and HTTP/3 require it, and Envoy normalises HTTP/1): a name with a capital
  letter would never match. At most 128 characters.
- `Port`: a TCP port.

This module sits below every package that owns a policy section (`extproc.config`, `extproc.endpoints`,
`extproc.scheduling`, `extproc.flow`, `extproc.limits`, `extproc.rollout`, `extproc.guard`), so it imports none.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = ["HEADER_PATTERN", "NAME_PATTERN", "ClassName", "HeaderName", "PoolName", "Port", "RuleName", "Strict",
           "check_header", "check_name"]

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
HEADER_PATTERN = re.compile(r"^[a-z0-9-]{1,128}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_name(value: str, what: str = "name") -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(f"{what} {value!r} must be 1-63 lower-case letters, digits, '_', '.' or '-', starting and "
                         "ending with a letter or digit")
    return value


def check_header(value: str) -> str:
    if not HEADER_PATTERN.match(value):
        raise ValueError(f"header name {value!r} must be 1-128 lower-case letters, digits and '-' (Envoy passes "
                         "header names lower-cased)")
    return value


PoolName = Annotated[str, AfterValidator(partial(check_name, what="pool name (an Envoy cluster name)"))]
ClassName = Annotated[str, AfterValidator(partial(check_name, what="priority class name"))]
RuleName = Annotated[str, AfterValidator(partial(check_name, what="guard rule name (a metric label)"))]
HeaderName = Annotated[str, AfterValidator(check_header)]
Port = Annotated[int, Field(ge=1, le=65535)]
