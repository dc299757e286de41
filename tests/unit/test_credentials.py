"""OAuth credentials toward upstream servers: the config shape, its problems with their places, resolution."""

from __future__ import annotations

import pytest

from gateway.config.credentials import Credential, credential_variables, use_problems
from gateway.config.servers import ConfigError, ServerSpec, resolve
from gateway.config.settings import build_settings

KEY = "k" * 32
CC = {"grant": "client_credentials", "client_id": "${CID}", "client_secret": "${CSECRET}", "token_url": "https://as/t"}


def problems_of(file_values: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_settings({}, file_values)
    return info.value.problems


def test_shapes_that_parse():
    settings = build_settings(
        {},
        {
            "oauth_key": KEY,
            "store": "sqlite:///x.db",
            "credentials": {
                "cc": {"oauth": {**CC, "scopes": ["read", "write"], "resource": "https://mcp.example.com/mcp"}},
                "person": {"oauth": {"grant": "refresh_token", "client_id": "app", "issuer": "https://id.example"}},
                "static": {"headers": {"Authorization": "Bearer ${T}"}},
            },
        },
    )
    assert settings.credentials["cc"].kind == "oauth:client_credentials"
    assert settings.credentials["cc"].oauth is not None and settings.credentials["cc"].oauth.method == (
        "client_secret_basic"
    )
    assert settings.credentials["person"].oauth is not None and settings.credentials["person"].oauth.method == "none"
    assert settings.credentials["static"].kind == "static"


@pytest.mark.parametrize(
    ("oauth", "expected"),
    [
        ({**CC, "token_url": None}, "credentials.x.oauth: give `issuer` (endpoints from its metadata) or `token_url`"),
        ({**CC, "client_secret": None}, "credentials.x.oauth: grant client_credentials needs `client_secret`"),
        (
            {**CC, "client_secret": None, "auth_method": "client_secret_post"},
            "client_secret_post needs `client_secret`",
        ),
        ({**CC, "auth_method": "none", "client_secret": None}, "grant client_credentials needs `client_secret`"),
        ({**CC, "grant": "password"}, "credentials.x.oauth.grant: Input should be 'client_credentials' or"),
        ({**CC, "scopes": ["a b"]}, "credentials.x.oauth.scopes: 'a b' is not a scope"),
        ({**CC, "token_url": "ftp://as"}, "credentials.x.oauth.token_url: the URL must start with http"),
        ({**CC, "token_url": "http://as.example/t"}, "credentials.x.oauth.token_url: must use https (http only on"),
        ({**CC, "resource": "https://r#frag"}, "credentials.x.oauth.resource: resource must not have a fragment"),
        ({**CC, "redirect_uri": "https://example.com/cb"}, "credentials.x.oauth.redirect_uri: redirect_uri must be"),
        ({**CC, "secret": "s"}, "credentials.x.oauth.secret: unknown key"),
    ],
)
def test_each_problem_has_its_place(oauth, expected):
    oauth = {k: v for k, v in oauth.items() if v is not None}
    problems = problems_of({"credentials": {"x": {"oauth": oauth}}})
    assert any(p.startswith(expected) or (expected in p and p.startswith("credentials.x.oauth")) for p in problems), (
        problems
    )


def test_an_oauth_credential_holds_nothing_else():
    problems = problems_of({"credentials": {"x": {"oauth": CC, "headers": {"A": "b"}}}})
    assert problems == [
        "credentials.x: an OAuth credential holds only `oauth` (the gateway sets the Authorization header)"
    ]


def test_refresh_tokens_need_a_key_and_a_store():
    person = {"oauth": {"grant": "refresh_token", "client_id": "app", "issuer": "https://id.example"}}
    assert problems_of({"credentials": {"p": person}, "store": "sqlite:///x.db"}) == [
        "credentials.p.oauth.grant: refresh_token needs `oauth_key` (or MANIFOLD_OAUTH_KEY): refresh tokens are "
        "only ever stored encrypted"
    ]
    assert problems_of({"credentials": {"p": person}, "oauth_key": KEY})[0].startswith(
        "credentials.p.oauth.grant: refresh_token needs a `store` (sqlite:///... or redis://...)"
    )
    assert problems_of({"oauth_key": "short"}) == [
        "oauth_key: at least 32 characters, please (e.g. the output of `openssl rand -base64 32`)"
    ]


def test_client_credentials_need_neither():
    assert build_settings({}, {"credentials": {"x": {"oauth": CC}}}).oauth_key is None


def test_unset_variables_are_named_with_their_place():
    credential = Credential.model_validate({"oauth": CC})
    assert credential_variables("x", credential, {"CID": "id"}) == [
        "credentials.x.oauth.client_secret: environment variable CSECRET is not set"
    ]
    assert credential_variables("x", credential, {"CID": "id", "CSECRET": "s"}) == []


def test_what_a_server_cannot_combine_with_an_oauth_credential():
    credential = Credential.model_validate({"oauth": CC})
    stdio = ServerSpec.model_validate({"name": "s", "command": "x"})
    assert use_problems(stdio, "x", credential) == [
        "credential: 'x' is an OAuth credential; it applies to HTTP servers only"
    ]
    http = ServerSpec.model_validate(
        {
            "name": "h",
            "url": "http://u/mcp",
            "headers": {"authorization": "Bearer t"},
            "forward_headers": ["Authorization"],
        }
    )
    assert use_problems(http, "x", credential, "servers.h.credential") == [
        "servers.h.credential: 'x' sets the Authorization header; remove it from `headers`",
        "servers.h.credential: 'x' sets the Authorization header; remove it from `forward_headers`",
    ]
    assert use_problems(http, "y", None)[0].startswith("credential: no credential named 'y'")


def test_resolve_fills_the_client_and_defaults_the_resource_to_the_server_url():
    credentials = {"x": Credential.model_validate({"oauth": {**CC, "scopes": ["read"]}})}
    spec = ServerSpec.model_validate({"name": "h", "url": "http://${HOST}/mcp", "credential": "x"})
    resolved = resolve(spec, {"HOST": "up.example", "CID": "id", "CSECRET": "sekrit"}, credentials)
    assert resolved.oauth is not None
    assert (resolved.oauth.client_id, resolved.oauth.client_secret) == ("id", "sekrit")
    assert resolved.oauth.resource == "http://up.example/mcp"
    assert resolved.oauth.scopes == ("read",)
    assert resolved.headers == {}
    assert "sekrit" not in repr(resolved.oauth)

    explicit = {"x": Credential.model_validate({"oauth": {**CC, "resource": False}})}
    resolved = resolve(spec, {"HOST": "up.example", "CID": "id", "CSECRET": "s"}, explicit)
    assert resolved.oauth is not None and resolved.oauth.resource is None

    plain = {"x": Credential.model_validate({"oauth": {**CC, "token_url": "${AS}/token"}})}
    with pytest.raises(ConfigError) as info:
        resolve(spec, {"HOST": "up.example", "CID": "id", "CSECRET": "s", "AS": "http://as.example"}, plain)
    assert info.value.problems == [
        "credentials.x.oauth.token_url: must use https (http only on a loopback address), got 'http://as.example/token'"
    ]

    with pytest.raises(ConfigError) as info:
        resolve(spec, {"HOST": "up.example"}, credentials)
    assert info.value.problems == [
        "credentials.x.oauth.client_id: environment variable CID is not set",
        "credentials.x.oauth.client_secret: environment variable CSECRET is not set",
    ]
