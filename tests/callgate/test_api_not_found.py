"""Under /api/, an unknown path answers JSON 404 and a wrong method JSON 405, never
Django's HTML page (issue 31, point 6)."""

from __future__ import annotations

from tests.factories import BaseTestCase

UNKNOWN = ["/api/", "/api/v1/nonexistent", "/api/v1/calls/op-1/x", "/api/v2/calls", "/api/v1/"]


class ApiNotFoundTests(BaseTestCase):
    def test_an_unknown_path_is_a_json_404_for_every_method_with_or_without_a_key(self):
        for client in (self.client, self.api()):
            for path in UNKNOWN:
                for method in ("get", "post", "put", "patch", "delete"):
                    with self.subTest(path=path, method=method):
                        response = getattr(client, method)(path)
                        assert response.status_code == 404
                        assert response["Content-Type"] == "application/json"
                        body = response.json()
                        assert body["error"].startswith(f"No API endpoint at {path};")
                        assert body["errors"] == [{"loc": "path", "msg": "no such endpoint"}]

    def test_a_known_path_with_a_wrong_method_is_a_json_405(self):
        for method, path in (
            ("delete", "/api/v1/events"),
            ("patch", "/api/v1/calls"),
            ("post", "/api/v1/calls/op-1"),
            ("put", "/api/v1/reports/reasons"),
            ("post", "/api/schema/"),  # the document is YAML, its errors JSON
            ("delete", "/api/docs/"),  # the page is HTML, its errors JSON
        ):
            with self.subTest(path=path, method=method):
                response = getattr(self.api(), method)(path)
                assert response.status_code == 405
                assert response["Content-Type"] == "application/json"
                assert response.json()["error"] == f'Method "{method.upper()}" not allowed.'

    def test_known_endpoints_still_answer(self):
        assert self.api().get("/api/v1/calls").status_code == 200
        schema = self.client.get("/api/schema/")
        assert schema.status_code == 200 and schema["Content-Type"].startswith(
            "application/vnd.oai.openapi"
        )
        docs = self.client.get("/api/docs/")
        assert docs.status_code == 200 and docs["Content-Type"].startswith("text/html")
        page = self.client.get("/nonexistent/")  # outside /api/: the browser's page
        assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
