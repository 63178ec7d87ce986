import re

import pytest

pytestmark = pytest.mark.django_db


def test_the_openapi_schema_documents_the_contracts(world):
    response = world.client("bob", scope="read").get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    assert {"post", "get"} <= set(paths["/api/v1/clusters/"])
    assert {"get", "put"} <= set(paths["/api/v1/clusters/{id}/topology/"])
    assert "post" in paths["/api/v1/clusters/{id}/enrollment-tokens/"]
    created = paths["/api/v1/clusters/{id}/enrollment-tokens/"]["post"]["responses"]["201"]
    ref = created["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert {"token", "install_command"} <= set(schema["components"]["schemas"][ref]["properties"])
    assert schema["components"]["securitySchemes"]["apiToken"]["scheme"] == "bearer"


def test_the_docs_page_loads_its_assets_from_this_console_not_a_cdn(world):
    response = world.session("bob").get("/api/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    # every script and stylesheet comes from this console (a random CSRF token may spell "cdn")
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert sources and all(s.startswith(("/", "#", "?")) for s in sources), sources


def test_the_browsable_api_renders_its_forms_in_the_callers_scope(world):
    from tests.factories import make_fleet

    make_fleet(world.acme, "acme-cluster")
    make_fleet(world.globex, "globex-cluster")
    response = world.session("alice").get("/api/v1/commands/", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    html = response.content.decode()
    # The form's node choices (rendered after the view returned) are Acme's nodes, not Globex's.
    assert "acme-node0" in html and "globex-node0" not in html
