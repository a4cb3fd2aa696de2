"""The outbound guard (``callgate.outbound``) on its own and behind each caller: the alert
webhooks (both formats), the decision webhooks and the reconcile look-ups. Internal
addresses are refused before connecting; the allow-list admits them, and then a real local
server receives the request at the address that was checked, with no redirect followed."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import SimpleTestCase, override_settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from alerts.models import AlertDelivery, AlertEvent, AlertRule
from alerts.services import DeliveryError, alert_deliver
from callgate import outbound
from callgate.admin import AgentAdminForm
from callgate.models import ToolContract
from callgate.reconcile import ABSENT, UNKNOWN, reconcile_lookup
from reviews import webhooks
from tests.factories import BaseTestCase


class LocalServer:
    """A real HTTP server on 127.0.0.1 (a free port) in a thread: records each request's
    path, headers and body, answers ``status`` (and ``Location`` for redirects)."""

    def __init__(self, status: int = 200, location: str = ""):
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                server.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(length),
                    }
                )
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:  # keep the test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LocalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


REFUSED_URLS = [
    "http://127.0.0.1/hook",
    "http://127.1/hook",  # the short form of 127.0.0.1
    "http://0x7f000001/hook",  # hexadecimal
    "http://2130706433/hook",  # one decimal number
    "http://localhost/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",  # shared address space (carrier-grade NAT)
    "http://169.254.169.254/latest/meta-data",  # cloud metadata (link-local)
    "http://0.0.0.0/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped
    "http://[::ffff:a9fe:a9fe]/hook",  # IPv4-mapped metadata
    "http://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
    "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
]


class AddressRuleTests(SimpleTestCase):
    def test_it_refuses_every_internal_form_before_connecting(self):
        reached = []
        inner = httpx.MockTransport(lambda request: reached.append(request) or httpx.Response(200))
        for url in REFUSED_URLS:
            with outbound.client(timeout=1, transport=inner) as client:
                with pytest.raises(outbound.OutboundRefused, match="non-public address"):
                    client.post(url)
        assert reached == []

    def test_embedded_ipv4_of_every_prefix_and_reserved_ranges_are_refused(self):
        """IPv4-compatible, IPv4-translated and local-use NAT64 (RFC 8215) addresses are
        judged by the IPv4 address they carry; site-local and 192.0.0.0/24 never pass."""
        for address in (
            "::7f00:1",  # IPv4-compatible 127.0.0.1
            "::a00:1",  # IPv4-compatible 10.0.0.1
            "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
            "::ffff:0:a9fe:a9fe",  # IPv4-translated 169.254.169.254
            "64:ff9b:1::7f00:1",  # local-use NAT64 of 127.0.0.1
            "64:ff9b:1:ffff::c0a8:1",  # local-use NAT64 of 192.168.0.1
            "fec0::1",  # site-local
            "feff::1",
            "192.0.0.8",
            "192.0.0.9",
        ):
            why = outbound.address_refusal(ipaddress.ip_address(address))
            assert why is not None and "non-public address" in why, address
        for url in ("http://[::7f00:1]/x", "http://[fec0::1]/x", "http://192.0.0.8/x"):
            assert outbound.url_refusal(url), url

    def test_public_addresses_pass_and_are_connected_to_as_checked(self):
        for address in ("93.184.215.14", "2606:4700:4700::1111", "2002:5db8:d70e::1"):
            assert outbound.address_refusal(ipaddress.ip_address(address)) is None, address

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["10.0.0.0/8", "fd00::/8", "hooks.internal"])
    def test_the_allow_list_admits_networks_and_host_names(self):
        reached: list[httpx.Request] = []
        inner = httpx.MockTransport(lambda request: reached.append(request) or httpx.Response(204))
        with outbound.client(timeout=1, transport=inner) as client:
            assert client.post("http://10.1.2.3/hook").status_code == 204
            assert client.post("http://[fd00::1]/hook").status_code == 204
            # a listed host name is trusted and reached by its name, unresolved
            assert client.post("http://hooks.internal/hook").status_code == 204
            with pytest.raises(outbound.OutboundRefused):
                client.post("http://192.168.1.1/hook")
        assert [r.url.host for r in reached] == ["10.1.2.3", "fd00::1", "hooks.internal"]

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["10.0.0.0/33"])
    def test_a_malformed_network_is_a_configuration_error(self):
        with outbound.client(timeout=1) as client:
            with pytest.raises(ImproperlyConfigured, match="10.0.0.0/33"):
                client.get("http://example.invalid/")

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"])
    def test_it_connects_to_the_address_it_checked_not_a_second_answer(self):
        """DNS rebinding: the name answers an allowed address when checked and a forbidden
        one afterwards; the request still goes to the checked address, named by the Host
        header, after a single look-up."""
        answers = iter(["127.0.0.1", "169.254.169.254"])
        asked: list[str] = []
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            asked.append(host)
            if host != "rebind.test":  # the connection itself: to the literal address
                return real(host, port, *args, **kwargs)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

        with (
            LocalServer(204) as server,
            mock.patch.object(socket, "getaddrinfo", side_effect=getaddrinfo),
        ):
            with outbound.client(timeout=5) as client:
                response = client.post(f"http://rebind.test:{server.port}/hook", content=b"{}")
        assert response.status_code == 204
        assert asked == ["rebind.test", "127.0.0.1"]
        assert server.requests[0]["headers"]["Host"] == f"rebind.test:{server.port}"

    def test_https_is_pinned_with_the_name_kept_for_tls_and_host(self):
        """The connection goes to the checked address; TLS's server name (and so the
        certificate check) and the Host header keep the name."""
        seen: list[httpx.Request] = []
        inner = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
        answer = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443))]
        with mock.patch.object(socket, "getaddrinfo", return_value=answer):
            with outbound.client(timeout=1, transport=inner) as client:
                client.post("https://hooks.example.com/services/x")
        [request] = seen
        assert str(request.url) == "https://93.184.215.14/services/x"
        assert request.headers["Host"] == "hooks.example.com"
        assert request.extensions["sni_hostname"] == "hooks.example.com"

    def test_a_name_with_one_internal_address_among_public_ones_is_refused(self):
        answer = [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 80)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 80, 0, 0)),
        ]
        with mock.patch.object(socket, "getaddrinfo", return_value=answer):
            with outbound.client(timeout=1) as client:
                with pytest.raises(outbound.OutboundRefused, match=r"non-public address \(::1\)"):
                    client.get("http://mixed.example.com/")

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"])
    def test_it_does_not_follow_redirects(self):
        with LocalServer(302, location="http://169.254.169.254/latest/meta-data") as server:
            with outbound.client(timeout=5) as client:
                response = client.post(server.url + "/hook")
        assert response.status_code == 302
        assert len(server.requests) == 1

    def test_a_name_that_does_not_resolve_is_a_connection_error(self):
        with outbound.client(timeout=1) as client:
            with pytest.raises(httpx.ConnectError, match="does not resolve"):
                client.get("http://no-such-host.invalid/")


class AlertWebhookGuardTests(BaseTestCase):
    def delivery(self, url: str, fmt: str) -> AlertDelivery:
        rule = AlertRule.objects.create(
            project=self.project,
            name="Argument errors",
            metric=AlertRule.Metric.CATEGORY_COUNT,
            target="argument_error",
            threshold=1,
            clear_threshold=1,
            webhook_url=url,
            webhook_format=fmt,
            webhook_secret="s3cret",
        )
        event = AlertEvent.objects.create(
            project=self.project,
            rule=rule,
            kind=AlertEvent.Kind.FIRING,
            value=3,
            threshold=1,
            message="Argument errors: 3 calls.",
            at=timezone.now() - timedelta(minutes=1),
        )
        return AlertDelivery.objects.create(
            event=event, channel=AlertDelivery.Channel.WEBHOOK, target=url
        )

    def test_both_formats_refuse_internal_addresses(self):
        for fmt in AlertRule.WebhookFormat.values:
            for url in ("http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data"):
                AlertRule.objects.all().delete()
                with pytest.raises(DeliveryError, match="non-public address"):
                    alert_deliver(self.delivery(url, fmt))

    @override_settings(
        CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"], CALLGATE_BASE_URL="https://callgate.example.org"
    )
    def test_the_slack_format_reaches_an_allowed_local_server_with_an_absolute_link(self):
        with LocalServer(200) as server:
            alert_deliver(self.delivery(server.url + "/slack", "slack"))
        [request] = server.requests
        text = json.loads(request["body"])["text"]
        assert "<https://callgate.example.org/p/acme/calls/?category=argument_error" in text
        assert text.endswith("|View the calls>")

    @override_settings(
        CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"], CALLGATE_BASE_URL="https://callgate.example.org"
    )
    def test_the_signed_format_reaches_an_allowed_local_server_with_absolute_urls(self):
        with LocalServer(204) as server:
            alert_deliver(self.delivery(server.url + "/signed", "callgate"))
        [request] = server.requests
        body = Webhook(b"s3cret").verify(request["body"], request["headers"])
        assert body["url"].startswith(
            "https://callgate.example.org/p/acme/calls/?category=argument_error&since="
        )
        assert body["history_url"] == "https://callgate.example.org/p/acme/alerts/history/"

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"])
    def test_a_redirecting_webhook_is_not_followed(self):
        with LocalServer(307, location="http://169.254.169.254/") as server:
            with pytest.raises(DeliveryError, match="HTTP 307"):
                alert_deliver(self.delivery(server.url + "/slack", "slack"))
        assert len(server.requests) == 1


class DecisionWebhookGuardTests(SimpleTestCase):
    payload = {"type": "decision", "delivery_id": "8a4f3f36-5a5c-4f5e-9a0e-1f8d1c2b3a4d"}

    def test_it_refuses_an_internal_address(self):
        with pytest.raises(outbound.OutboundRefused, match="non-public address"):
            webhooks.webhook_post(url="http://[::1]:9/hook", secret="s", payload=self.payload)

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"])
    def test_an_allowed_local_server_gets_the_signed_post(self):
        with LocalServer(200) as server:
            response = webhooks.webhook_post(
                url=server.url + "/hook", secret="s3cret", payload=self.payload
            )
        assert response.status_code == 200
        [request] = server.requests
        assert Webhook(b"s3cret").verify(request["body"], request["headers"]) == self.payload


class AgentWebhookSettingTests(BaseTestCase):
    def test_the_admin_refuses_an_internal_agent_webhook_beside_the_field(self):
        data = {
            "project": self.project.pk,
            "name": "billing-bot",
            "description": "",
            "webhook_secret": "s",
            "created_at_0": "2026-12-06",
            "created_at_1": "00:00:00",
        }
        for url in ("http://127.0.0.1/x", "http://169.254.169.254/", "http://[::7f00:1]/"):
            form = AgentAdminForm(data={**data, "webhook_url": url})
            assert not form.is_valid()
            assert "may not post to this address" in form.errors["webhook_url"][0], url
        form = AgentAdminForm(data={**data, "webhook_url": "https://93.184.215.14/hook"})
        assert "webhook_url" not in form.errors


class ReconcileGuardTests(SimpleTestCase):
    def lookup(self, url: str):
        contract = ToolContract(name="t", reconcile_method="http", reconcile_url=url)
        return reconcile_lookup(contract=contract, operation_id="op-1", arguments={})

    def test_it_refuses_an_internal_address(self):
        result = self.lookup("http://[::ffff:127.0.0.1]:9/ops/{operation_id}")
        assert result.outcome == UNKNOWN and "non-public address" in result.detail

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["127.0.0.1/32"])
    def test_an_allowed_local_server_is_looked_up(self):
        with LocalServer(404) as server:
            result = self.lookup(server.url + "/ops/{operation_id}")
        assert result.outcome == ABSENT
        assert [r["path"] for r in server.requests] == ["/ops/op-1"]
