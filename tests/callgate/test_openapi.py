"""The OpenAPI document is valid and its docs page is served from our own static files."""

from __future__ import annotations

import io
import json

from django.core.management import call_command

from tests.factories import BaseTestCase


class OpenApiTests(BaseTestCase):
    def test_it_generates_a_valid_document_without_warnings(self):
        out = io.StringIO()
        call_command(
            "spectacular", "--format", "openapi-json", "--validate", "--fail-on-warn", stdout=out
        )
        document = json.loads(out.getvalue())
        assert document["openapi"].startswith("3.1")
        for path in (
            "/api/v1/events",
            "/api/v1/events/{event_id}",
            "/api/v1/calls",
            "/api/v1/calls/{operation_id}",
            "/api/v1/tools/{name}",
        ):
            assert path in document["paths"]
        event = document["paths"]["/api/v1/events/{event_id}"]["get"]
        assert {"200", "400", "404"} <= set(event["responses"])
        events = document["paths"]["/api/v1/events"]["post"]
        assert {"200", "207", "413"} <= set(events["responses"])
        assert "207" in events["description"] or "Multi-Status" in events["description"]

    def test_the_docs_page_loads_no_third_party_host(self):
        self.client.force_login(self.alice)
        page = self.client.get("/api/docs/")
        assert page.status_code == 200
        html = page.content.decode()
        assert "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html
        assert "/static/drf_spectacular_sidecar/" in html
