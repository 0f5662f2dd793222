"""E2B Secrets through the official SDK's `Secret` (create, get_info, list with paging,
update, exists, destroy) against e2b-local, and no answer, SDK-parsed or raw, carrying a
value. Both pinned SDKs have `Secret`; an SDK without it skips, naming what is missing."""

import json
import urllib.error
import urllib.request

import pytest

from conftest import API_KEY

VALUE = "ghp_conformance-secret-value-0b7f"


def secret_api():
    try:
        from e2b import Secret
        from e2b.exceptions import SecretException, SecretNotFoundException
    except ImportError as error:
        import e2b

        version = getattr(e2b, "__version__", "this version")
        pytest.skip(f"the installed e2b ({version}) has no Secret API: {error}")
    return Secret, SecretException, SecretNotFoundException


def raw(server, method, path, body=None):
    """One request outside the SDK: (status, body text)."""
    request = urllib.request.Request(
        f"{server.api_url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"X-API-Key": API_KEY, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def assert_no_value(*shown):
    for text in shown:
        assert "secret-value" not in str(text), text


def drain(paginator):
    items, pages = [], 0
    while paginator.has_next:
        items.extend(paginator.next_items())
        pages += 1
    return items, pages


def test_secret_crud_through_the_sdk(server, unique):
    # contract: X20
    Secret, _, SecretNotFoundException = secret_api()
    name = f"GH-{unique}"
    canonical = name.lower()
    info = Secret.create(name, VALUE, metadata={"owner": "hermes"})
    assert info.secret_id.startswith("sec_")
    assert info.name == canonical
    assert info.version == 1
    assert info.metadata == {"owner": "hermes"}
    assert info.created_at == info.updated_at
    assert not hasattr(info, "value")
    assert_no_value(repr(info), vars(info))

    assert Secret.get_info(canonical) == info
    assert Secret.get_info(info.secret_id) == info
    assert Secret.exists(canonical) is True

    rotated = Secret.update(canonical, "ghp_conformance-secret-value-rotated")
    assert rotated.secret_id == info.secret_id
    assert rotated.version == 2
    assert rotated.metadata == {"owner": "hermes"}
    assert_no_value(repr(rotated))
    replaced = Secret.update(info.secret_id, VALUE, metadata={"rotated": "yes"})
    assert replaced.version == 3
    assert replaced.metadata == {"rotated": "yes"}

    listed, _ = drain(Secret.list())
    assert canonical in [secret.name for secret in listed]
    assert_no_value(*[repr(secret) for secret in listed])

    assert Secret.destroy(canonical) is True
    assert Secret.destroy(canonical) is False
    assert Secret.exists(canonical) is False
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(canonical)
    with pytest.raises(SecretNotFoundException):
        Secret.update(canonical, VALUE)


def test_secret_list_pages_with_the_next_token(server, unique):
    Secret, _, _ = secret_api()
    names = [f"page-{unique}-{i}" for i in range(3)]
    for name in names:
        Secret.create(name, VALUE)
    try:
        listed, pages = drain(Secret.list(limit=2))
        mine = [secret.name for secret in listed if secret.name in names]
        assert mine == names
        assert pages >= 2
    finally:
        for name in names:
            Secret.destroy(name)


def test_a_taken_or_bad_name_is_refused_without_the_value(server, unique):
    Secret, SecretException, _ = secret_api()
    name = f"taken-{unique}"
    Secret.create(name, VALUE)
    try:
        with pytest.raises(SecretException) as taken:
            Secret.create(name.upper(), VALUE)
        assert str(taken.value).startswith("409"), taken.value
        assert_no_value(str(taken.value))
        with pytest.raises(SecretException) as bad:
            Secret.create(f"sec_{unique}", VALUE)
        assert str(bad.value).startswith("400: name"), bad.value
        assert_no_value(str(bad.value))
    finally:
        Secret.destroy(name)


def test_no_raw_answer_carries_the_value(server, unique):
    # contract: X20
    secret_api()
    name = f"raw-{unique}"
    answers = [
        raw(server, "POST", "/secrets", {"name": name, "value": VALUE}),
        raw(server, "GET", "/secrets"),
        raw(server, "GET", f"/secrets/{name}"),
        raw(server, "POST", f"/secrets/{name}", {"value": VALUE}),
        raw(server, "POST", "/secrets", {"name": name, "value": VALUE}),
        raw(server, "POST", "/secrets", {"name": "bad name", "value": VALUE}),
        raw(server, "POST", f"/secrets/{name}", {"value": VALUE, "metadata": "x"}),
        raw(server, "DELETE", f"/secrets/{name}"),
        raw(server, "POST", f"/secrets/{name}", {"value": VALUE}),
    ]
    statuses = [status for status, _ in answers]
    assert statuses == [201, 200, 200, 200, 409, 400, 400, 204, 404], answers
    assert_no_value(*[text for _, text in answers])
