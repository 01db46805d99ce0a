"""The autoscaling section's rules: the scaler is authenticated (mTLS on its own port) unless told otherwise."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from extproc.autoscale import AutoscalingConfig

TLS = {"cert_file": "/tls/tls.crt", "key_file": "/tls/tls.key", "client_ca_file": "/tls/ca.crt"}


def test_enabled_without_tls_is_refused_unless_allowed() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling\.tls"):
        AutoscalingConfig.model_validate({"enabled": True})
    assert AutoscalingConfig.model_validate({"enabled": True, "allow_unauthenticated": True}).tls is None
    assert not AutoscalingConfig().enabled  # off by default: nothing to authenticate


def test_tls_needs_a_port_of_its_own() -> None:
    with pytest.raises(ValidationError, match="grpc_port"):
        AutoscalingConfig.model_validate({"enabled": True, "tls": TLS})
    config = AutoscalingConfig.model_validate({"enabled": True, "tls": TLS, "grpc_port": 9004})
    assert config.tls is not None and config.tls.client_ca_file == "/tls/ca.crt"


def test_the_client_ca_is_required_and_absolute() -> None:
    with pytest.raises(ValidationError, match="absolute path"):
        AutoscalingConfig.model_validate({"enabled": True, "grpc_port": 9004, "tls": {**TLS, "client_ca_file": "ca"}})
    with pytest.raises(ValidationError, match="client_ca_file"):
        AutoscalingConfig.model_validate({"enabled": True, "grpc_port": 9004,
                                          "tls": {k: v for k, v in TLS.items() if k != "client_ca_file"}})
