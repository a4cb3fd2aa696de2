"""The gateway page and the configuration services (no MCP traffic)."""

from __future__ import annotations

from callgate.models import Membership, ToolContract
from mcp_gateway import services
from mcp_gateway.models import Upstream
from tests.factories import BaseTestCase

LOOKUP = {
    "name": "lookup",
    "description": "Look up an order by its ID.",
    "inputSchema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
    "annotations": {"readOnlyHint": True},
}
DELETE = {
    "name": "delete_order",
    "description": "Delete an order for good.",
    "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    "annotations": {"destructiveHint": True},
}


class ContractMappingTests(BaseTestCase):
    def test_annotations_map_to_effect_and_approval_and_overrides_win(self):
        self.assertEqual(services.contract_for_tool(LOOKUP).effect, "read")
        delete = services.contract_for_tool(DELETE)
        self.assertEqual((delete.effect, delete.requires_approval), ("write", True))
        overridden = services.contract_for_tool(DELETE, {"requires_approval": False})
        self.assertFalse(overridden.requires_approval)
        plain = services.contract_for_tool({**DELETE, "annotations": None})
        self.assertEqual((plain.effect, plain.requires_approval), ("write", False))

    def test_clashing_names_are_prefixed_with_the_upstream(self):
        names = services.exposed_names({"a": [LOOKUP, DELETE], "b": [LOOKUP]})
        self.assertEqual(names[("a", "lookup")], "a__lookup")
        self.assertEqual(names[("b", "lookup")], "b__lookup")
        self.assertEqual(names[("a", "delete_order")], "delete_order")

    def test_a_changed_upstream_schema_is_a_new_contract_version(self):
        upstream = services.upstream_set(project=self.project, name="shop", target="shop-mcp")
        names = {"lookup": "lookup"}
        services.tools_publish(upstream_id=upstream.pk, tools=[LOOKUP], names=names)
        services.tools_publish(upstream_id=upstream.pk, tools=[LOOKUP], names=names)
        changed = {**LOOKUP, "inputSchema": {**LOOKUP["inputSchema"], "required": []}}
        services.tools_publish(upstream_id=upstream.pk, tools=[changed], names=names)
        versions = list(
            ToolContract.objects.filter(project=self.project, name="lookup").values_list(
                "version", flat=True
            )
        )
        self.assertEqual(sorted(versions), [1, 2])
        upstream.refresh_from_db()
        self.assertEqual((upstream.status, upstream.tools[0]["version"]), ("up", 2))

    def test_a_tool_whose_schema_is_not_a_schema_is_listed_with_its_error(self):
        upstream = services.upstream_set(project=self.project, name="shop", target="shop-mcp")
        bad = {**LOOKUP, "inputSchema": {"type": "object", "properties": {"x": {"type": 7}}}}
        [entry] = services.tools_publish(
            upstream_id=upstream.pk, tools=[bad], names={"lookup": "lookup"}
        )
        self.assertIsNone(entry["contract"])
        self.assertIn("parameters", entry["error"])

    def test_bad_targets_and_overrides_name_the_field(self):
        with self.assertRaisesRegex(ValueError, "^name:"):
            services.upstream_set(project=self.project, name="no spaces", target="x")
        with self.assertRaisesRegex(ValueError, "^command:"):
            services.upstream_set(project=self.project, name="a", target="'unclosed")
        with self.assertRaisesRegex(ValueError, "^tool_overrides: lookup.effect"):
            services.upstream_configure(
                project=self.project,
                name="a",
                target="x",
                tool_overrides={"lookup": {"effect": "x"}},
            )


class GatewayPageTests(BaseTestCase):
    def setUp(self):
        self.upstream = services.upstream_set(
            project=self.project, name="shop", target="http://127.0.0.1:9/mcp"
        )
        services.tools_publish(
            upstream_id=self.upstream.pk, tools=[LOOKUP], names={"lookup": "lookup"}
        )
        changed = {**LOOKUP, "description": "Look up an order by its ID or its number."}
        services.tools_publish(
            upstream_id=self.upstream.pk, tools=[changed], names={"lookup": "lookup"}
        )
        Upstream.objects.filter(pk=self.upstream.pk).update(
            status="down", last_error="ConnectError: All connection attempts failed"
        )

    def url(self, suffix: str = "") -> str:
        return f"/p/{self.project.slug}/gateway/{suffix}"

    def test_members_see_upstreams_health_and_last_error(self):
        self.client.force_login(self.victor)
        page = self.client.get(self.url())
        self.assertContains(page, "shop")
        self.assertContains(page, "ConnectError: All connection attempts failed")
        self.assertContains(page, ">changed</span>")
        self.assertContains(page, f"/p/{self.project.slug}/contracts/lookup/")
        self.assertNotContains(page, "Add an upstream")

    def test_outsiders_get_404_and_viewers_cannot_change(self):
        self.client.force_login(self.olga)
        self.assertEqual(self.client.get(self.url()).status_code, 404)
        self.client.force_login(self.victor)
        response = self.client.post(self.url("upstreams/"), {"name": "x", "target": "cmd"})
        self.assertEqual(response.status_code, 403)

    def test_an_admin_adds_and_changes_upstreams_with_field_errors(self):
        Membership.objects.filter(user=self.maria, project=self.project).update(role="admin")
        self.client.force_login(self.maria)
        response = self.client.post(
            self.url("upstreams/"),
            {
                "name": "desk",
                "target": "python desk.py",
                "timeout": "12",
                "overrides": '{"close": {"requires_approval": true}}',
            },
        )
        self.assertEqual(response.status_code, 302)
        desk = Upstream.objects.get(project=self.project, name="desk")
        self.assertEqual((desk.transport, desk.timeout_seconds), ("stdio", 12.0))
        self.assertEqual(desk.tool_overrides, {"close": {"requires_approval": True}})
        bad = self.client.post(
            self.url("upstreams/"), {"name": "desk", "target": "x", "overrides": "{nope"}
        )
        self.assertContains(bad, "tool overrides: not JSON", status_code=400)
        bad = self.client.post(
            self.url("upstreams/"), {"name": "desk", "target": "x", "timeout": "0"}
        )
        self.assertContains(bad, "timeout_seconds", status_code=400)
        self.client.post(self.url(f"upstreams/{desk.pk}/delete/"))
        self.assertFalse(Upstream.objects.filter(pk=desk.pk).exists())
