"""The contracts the gate and the drain apply come from a per-process cache
(``callgate.ingest.tools_for``) stamped with the project's ``config_version``, and the API
keys (with their agent and project rows) from one stamped in the shared cache
(``callgate.auth.api_key_verify``): a change made anywhere, in this process or another, is
what the next request sees."""

from __future__ import annotations

import copy
from unittest import mock

from django.core.cache import cache
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from callgate.auth import _stamp_name, api_key_revoke
from callgate.models import Agent, AgentTool, ApiKey, Project, ToolContract
from tests.factories import WEATHER, BaseTestCase


class ToolsCacheTests(BaseTestCase):
    def setUp(self):
        self.client_api = self.api()
        response = self.client_api.put("/api/v1/tools/get_weather", WEATHER, format="json")
        assert response.status_code == 201, response.content

    def gate(self, city) -> dict:
        body = {"format": "plain", "call": {"tool": "get_weather", "arguments": {"city": city}}}
        response = self.client_api.post("/api/v1/calls", body, format="json")
        assert response.status_code == 200, response.content
        return response.json()

    def contract_queries(self, run) -> int:
        with CaptureQueriesContext(connection) as queries:
            run()
        return sum('FROM "callgate_toolcontract"' in q["sql"] for q in queries.captured_queries)

    def test_a_warm_check_reads_no_contract_and_a_new_version_is_applied_at_once(self):
        assert self.gate("Oslo")["verdict"] == "allow"
        assert self.contract_queries(lambda: self.gate("Paris")) == 0
        stricter = copy.deepcopy(WEATHER)
        stricter["parameters"]["properties"]["city"]["pattern"] = "^[A-Z]{3}$"
        response = self.client_api.put("/api/v1/tools/get_weather", stricter, format="json")
        assert response.status_code == 201, response.content
        assert self.gate("Lima")["verdict"] == "reask"
        assert self.gate("LIM")["verdict"] == "allow"

    def test_a_change_made_by_another_process_is_seen_through_the_version_stamp(self):
        assert self.gate("Oslo")["verdict"] == "allow"
        # another process: its write and its signal's bump reach the database, not our cache
        contract = ToolContract.objects.get(project=self.project, name="get_weather")
        parameters = copy.deepcopy(contract.parameters)
        parameters["properties"]["city"]["pattern"] = "^[A-Z]{3}$"
        ToolContract.objects.filter(pk=contract.pk).update(parameters=parameters)
        assert self.gate("Pune")["verdict"] == "allow"  # no bump yet: the cached version
        # its bump: the stamp in the database, and the project's key stamp in the shared cache
        # (this process keeps the project row with its key)
        Project.objects.filter(pk=self.project.pk).update(config_version=F("config_version") + 1)
        assert self.gate("Pune")["verdict"] == "allow"
        cache.delete(_stamp_name(self.project.pk))
        assert self.gate("Rome")["verdict"] == "reask"

    def test_registering_a_tool_for_an_agent_bumps_the_stamp(self):
        before = Project.objects.get(pk=self.project.pk).config_version
        other = Agent.objects.create(project=self.project, name="other-bot")
        AgentTool.objects.create(agent=other, name="get_weather")
        assert Project.objects.get(pk=self.project.pk).config_version == before + 1
        AgentTool.objects.filter(agent=other).delete()
        assert Project.objects.get(pk=self.project.pk).config_version == before + 2


class KeysCacheTests(BaseTestCase):
    PROBE = "/api/v1/calls?limit=1"

    def key_queries(self, client) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            status = client.get(self.PROBE).status_code
        return status, sum('FROM "callgate_apikey"' in q["sql"] for q in queries.captured_queries)

    def test_a_known_key_is_answered_without_sql_until_its_project_changes(self):
        client = self.api()
        assert self.key_queries(client)[0] == 200
        assert self.key_queries(client) == (200, 0)
        self.agent.name = "renamed-bot"  # any change of the agent, key or project: read again
        self.agent.save()
        assert self.key_queries(client) == (200, 2)
        assert self.key_queries(client) == (200, 0)

    def test_a_key_revoked_by_another_process_is_refused_at_its_next_request(self):
        client = self.api()
        assert self.key_queries(client)[0] == 200
        # another process: the revocation reaches the database and the shared stamp only
        key = ApiKey.objects.get(agent=self.agent)
        ApiKey.objects.filter(pk=key.pk).update(revoked_at=key.created_at)
        assert self.key_queries(client)[0] == 200  # this process has not heard of it yet
        cache.delete(_stamp_name(self.project.pk))
        assert client.get(self.PROBE).status_code == 401

    def test_a_key_revoked_here_is_refused_at_once(self):
        client = self.api()
        assert client.get(self.PROBE).status_code == 200
        api_key_revoke(api_key=ApiKey.objects.get(agent=self.agent))
        assert client.get(self.PROBE).status_code == 401

    def test_an_evicted_stamp_means_reading_again_never_trusting(self):
        client = self.api()
        assert client.get(self.PROBE).status_code == 200
        key = ApiKey.objects.get(agent=self.agent)
        ApiKey.objects.filter(pk=key.pk).update(revoked_at=key.created_at)
        cache.clear()  # a full cache evicts the stamp
        assert client.get(self.PROBE).status_code == 401

    def test_an_entry_is_trusted_for_a_bounded_time_even_when_a_bump_was_lost(self):
        client = self.api()
        assert client.get(self.PROBE).status_code == 200
        key = ApiKey.objects.get(agent=self.agent)
        ApiKey.objects.filter(pk=key.pk).update(revoked_at=key.created_at)  # no bump reached
        assert client.get(self.PROBE).status_code == 200
        with mock.patch("callgate.auth.KEYS_CACHE_MAX_AGE", 0):  # as if that long had passed
            assert client.get(self.PROBE).status_code == 401
