"""The target-system simulator: the support-ticket service, its idempotency by operation
ID, its write log, tenant isolation, and every failure mode."""

from __future__ import annotations

import json
import threading
from urllib.parse import quote

import httpx
from django.test import SimpleTestCase, override_settings

from demo.simulator import SimulatorService, default_service, demo_service, simulator_transport

ACME_TOKEN = "acme-secret"
GLOBEX_TOKEN = "globex-secret"


def follow_up(
    ticket_id: str = "T-1", assignee_id: str = "u-7", due_at: str = "2026-12-01T09:00:00Z"
) -> dict:
    return {"ticket_id": ticket_id, "assignee_id": assignee_id, "due_at": due_at}


class SimulatorTestCase(SimpleTestCase):
    def setUp(self):
        self.service = SimulatorService({"acme": ACME_TOKEN, "globex": GLOBEX_TOKEN})
        self.ticket = self.service.add_ticket("acme", "Printer on fire")  # T-1
        self.other_ticket = self.service.add_ticket("globex", "Globex payroll")  # T-2
        self.client = httpx.Client(
            transport=simulator_transport(self.service), base_url="http://sim"
        )

    def tearDown(self):
        self.client.close()

    def create(
        self,
        operation_id: str,
        body: dict | None = None,
        *,
        tenant: str = "acme",
        token: str = ACME_TOKEN,
    ):
        return self.client.post(
            f"/tenants/{tenant}/follow-ups",
            json=body or follow_up(self.ticket),
            headers={"Idempotency-Key": operation_id, "Authorization": f"Bearer {token}"},
        )

    def lookup(self, operation_id: str, *, tenant: str = "acme", token: str = ACME_TOKEN):
        return self.client.get(
            f"/tenants/{tenant}/operations/{quote(operation_id, safe='')}",
            headers={"Authorization": f"Bearer {token}"},
        )


class SimulatorServiceTests(SimulatorTestCase):
    def test_it_creates_a_follow_up_and_logs_one_write(self):
        response = self.create("op-1")

        assert response.status_code == 201
        assert response.json()["receipt"]["id"] == "F-1"
        assert response.json()["receipt"]["ticket_id"] == "T-1"
        assert [w["operation_id"] for w in self.service.writes] == ["op-1"]

    def test_it_returns_the_first_receipt_for_a_repeated_operation_without_a_second_write(self):
        first = self.create("op-1")
        second = self.create("op-1")

        assert second.status_code == 200
        assert second.headers["Idempotent-Replayed"] == "true"
        assert second.json()["receipt"] == first.json()["receipt"]
        assert len(self.service.writes) == 1

    def test_it_rejects_a_reused_operation_id_with_a_different_body(self):
        self.create("op-1")
        response = self.create("op-1", follow_up(self.ticket, assignee_id="u-8"))

        assert response.status_code == 422
        assert len(self.service.writes) == 1

    def test_it_requires_an_idempotency_key(self):
        response = self.client.post(
            "/tenants/acme/follow-ups",
            json=follow_up(),
            headers={"Authorization": f"Bearer {ACME_TOKEN}"},
        )

        assert response.status_code == 400
        assert self.service.writes == []

    def test_it_answers_422_for_a_bad_body(self):
        response = self.create("op-1", {"ticket_id": "T-1"})

        assert response.status_code == 422
        assert "assignee_id is required (string)" in response.json()["problems"]

    def test_it_looks_up_an_operation_with_its_request_and_receipt(self):
        receipt = self.create("op/with?odd chars").json()["receipt"]
        response = self.lookup("op/with?odd chars")

        assert response.status_code == 200
        assert response.json() == {
            "operation_id": "op/with?odd chars",
            "request": follow_up(self.ticket),
            "receipt": receipt,
        }

    def test_it_answers_404_for_an_unknown_operation(self):
        assert self.lookup("never-sent").status_code == 404

    def test_it_rejects_a_bad_token_with_401(self):
        assert self.create("op-1", token="wrong").status_code == 401
        assert self.lookup("op-1", token="wrong").status_code == 401
        assert (
            self.client.get("/tickets/T-1", headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        assert self.service.writes == []

    def test_it_rejects_another_tenants_token_on_a_tenant_path(self):
        assert self.create("op-1", token=GLOBEX_TOKEN).status_code == 401

    def test_it_refuses_another_tenants_ticket_naming_the_owner(self):
        response = self.create("op-1", follow_up(self.other_ticket))

        assert response.status_code == 403
        assert response.json()["owner"] == "globex"
        assert "globex" in response.json()["error"]
        assert self.service.writes == []

    def test_it_keeps_operations_apart_per_tenant(self):
        self.create("op-1")
        other = self.create(
            "op-1", follow_up(self.other_ticket), tenant="globex", token=GLOBEX_TOKEN
        )

        assert other.status_code == 201
        assert (
            self.lookup("op-1", tenant="globex", token=GLOBEX_TOKEN).json()["request"]["ticket_id"]
            == "T-2"
        )
        assert len(self.service.writes) == 2

    def test_it_answers_404_for_a_deleted_ticket(self):
        self.service.delete_ticket(self.ticket)

        assert self.create("op-1").status_code == 404
        assert (
            self.client.get(
                "/tickets/T-1", headers={"Authorization": f"Bearer {ACME_TOKEN}"}
            ).status_code
            == 404
        )

    def test_it_answers_409_for_a_closed_ticket(self):
        self.service.close_ticket(self.ticket)

        assert self.create("op-1").status_code == 409

    def test_it_reads_tickets_of_the_tokens_tenant_only(self):
        headers = {"Authorization": f"Bearer {ACME_TOKEN}"}

        assert (
            self.client.get("/tickets/T-1", headers=headers).json()["subject"] == "Printer on fire"
        )
        assert [
            t["id"] for t in self.client.get("/tickets", headers=headers).json()["tickets"]
        ] == ["T-1"]
        forbidden = self.client.get("/tickets/T-2", headers=headers)
        assert forbidden.status_code == 403
        assert forbidden.json()["owner"] == "globex"

    def test_it_writes_once_under_concurrent_requests_with_one_key(self):
        results = []

        def send():
            with httpx.Client(
                transport=simulator_transport(self.service), base_url="http://sim"
            ) as client:
                results.append(
                    client.post(
                        "/tenants/acme/follow-ups",
                        json=follow_up(self.ticket),
                        headers={
                            "Idempotency-Key": "op-race",
                            "Authorization": f"Bearer {ACME_TOKEN}",
                        },
                    ).status_code
                )

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert sorted(results) == [200] * 7 + [201]
        assert len(self.service.writes) == 1


class SimulatorFailureModeTests(SimulatorTestCase):
    def test_it_answers_503_before_the_write(self):
        self.service.fail_next("unavailable")

        assert self.create("op-1").status_code == 503
        assert self.service.writes == []
        assert self.create("op-1").status_code == 201  # one failure only

    def test_it_answers_429_with_retry_after(self):
        self.service.fail_next("rate_limited", retry_after=7)
        response = self.create("op-1")

        assert response.status_code == 429
        assert response.headers["Retry-After"] == "7"
        assert self.service.writes == []

    def test_it_fails_the_given_number_of_requests(self):
        self.service.fail_next("server_error", count=2)

        assert [self.create("op-1").status_code for _ in range(3)] == [500, 500, 201]

    def test_it_refuses_the_connection_without_sending(self):
        self.service.fail_next("connect_error")

        with self.assertRaises(httpx.ConnectError):
            self.create("op-1")
        assert self.service.writes == []

    def test_it_times_out_after_applying_the_write(self):
        self.service.fail_next("timeout_after_write")

        with self.assertRaises(httpx.ReadTimeout):
            self.create("op-1")
        assert [w["operation_id"] for w in self.service.writes] == ["op-1"]
        assert self.lookup("op-1").status_code == 200
        assert self.create("op-1").status_code == 200  # the retry is deduplicated
        assert len(self.service.writes) == 1

    def test_it_times_out_without_writing(self):
        self.service.fail_next("timeout_no_write")

        with self.assertRaises(httpx.ReadTimeout):
            self.create("op-1")
        assert self.service.writes == []
        assert self.lookup("op-1").status_code == 404

    def test_it_confirms_late_after_some_lookups(self):
        self.service.fail_next("late_confirmation", after_lookups=2)

        with self.assertRaises(httpx.ReadTimeout):
            self.create("op-1")
        assert len(self.service.writes) == 1
        assert [self.lookup("op-1").status_code for _ in range(3)] == [404, 404, 200]

    def test_it_confirms_late_on_confirm_pending(self):
        self.service.fail_next("late_confirmation", after_lookups=100)
        with self.assertRaises(httpx.ReadTimeout):
            self.create("op-1")

        assert self.lookup("op-1").status_code == 404
        assert self.service.confirm_pending() == 1
        assert self.lookup("op-1").status_code == 200

    def test_it_answers_forced_conflict_forbidden_not_found_and_unauthorized(self):
        for mode, status in [
            ("conflict", 409),
            ("forbidden", 403),
            ("not_found", 404),
            ("unauthorized", 401),
        ]:
            self.service.fail_next(mode)
            assert self.create("op-1").status_code == status, mode
        assert self.service.writes == []

    def test_it_fails_lookups_only_when_scoped_to_them(self):
        self.create("op-1")
        self.service.fail_next("unavailable", on="lookup")

        assert self.create("op-2").status_code == 201
        assert self.lookup("op-1").status_code == 503
        assert self.lookup("op-1").status_code == 200

    def test_it_answers_a_body_that_is_not_json(self):
        self.service.fail_next("garbage", on="lookup")
        response = self.lookup("op-1")

        assert response.status_code == 200
        with self.assertRaises(ValueError):
            response.json()

    def test_it_rejects_an_unknown_mode(self):
        with self.assertRaises(ValueError):
            self.service.fail_next("gremlins")


class SimulatorControlTests(SimulatorTestCase):
    def test_it_queues_failures_and_lists_writes_over_http(self):
        queued = self.client.post("/_control/fail", json={"mode": "unavailable", "count": 1})
        assert queued.status_code == 200

        assert self.create("op-1").status_code == 503
        assert self.create("op-1").status_code == 201
        writes = self.client.get("/_control/writes").json()["writes"]
        assert [w["operation_id"] for w in writes] == ["op-1"]

    def test_it_confirms_creates_and_deletes_tickets_over_http(self):
        ticket = self.client.post(
            "/_control/tickets", json={"tenant": "acme", "subject": "New"}
        ).json()
        assert ticket["id"] == "T-3"
        assert (
            self.client.post(f"/_control/tickets/{ticket['id']}/delete").json()["status"]
            == "deleted"
        )
        assert self.client.post("/_control/confirm").json() == {"confirmed": 0}
        assert self.client.post("/_control/fail", json={"mode": "nope"}).status_code == 400


class SimulatorWsgiTests(SimpleTestCase):
    def test_it_turns_a_timeout_after_write_into_504_over_plain_wsgi(self):
        service = demo_service()
        service.fail_next("timeout_after_write")
        with httpx.Client(
            transport=httpx.WSGITransport(app=service), base_url="http://sim"
        ) as client:
            response = client.post(
                "/tenants/acme/follow-ups",
                json=follow_up("T-1"),
                headers={"Idempotency-Key": "op-1", "Authorization": "Bearer sim-acme-token"},
            )

        assert response.status_code == 504
        assert len(service.writes) == 1

    @override_settings(DEBUG=True, CALLGATE_DEMO=True)
    def test_it_is_mounted_under_simulator_in_the_callgate_server(self):
        token = "sim-acme-token"
        response = self.client.get("/simulator/tickets/T-1", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 200
        assert json.loads(response.content)["id"] == "T-1"

        created = self.client.post(
            "/simulator/tenants/acme/follow-ups",
            data=json.dumps(follow_up("T-2")),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
            HTTP_IDEMPOTENCY_KEY="mounted-op-1",
        )
        assert created.status_code in (200, 201)
        assert default_service().operation("acme", "mounted-op-1") is not None

    @override_settings(CALLGATE_DEMO=False)
    def test_it_is_not_served_when_switched_off(self):
        assert self.client.get("/simulator/tickets/T-1").status_code == 404
