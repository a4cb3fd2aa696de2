"""The search language (``callgate.search``) and what its terms select on the calls list,
``GET /api/v1/calls?q=`` and the review queue: each key, negation, free text, and
malformed queries answered with the term named, never a 500."""

from __future__ import annotations

from datetime import timedelta

from django.test import SimpleTestCase
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from callgate import search, selectors
from callgate.models import Agent
from callgate.search import QueryError, Term, query_parse, query_text
from callgate.selectors import CallFilters
from callgate.taxonomy import TABLE, Reason
from reviews import selectors as queue
from reviews.models import ReviewItem
from tests.factories import BaseTestCase, make_call, make_review_item


class ParserTests(SimpleTestCase):
    def test_it_reads_keys_free_text_quotes_and_negation(self):
        terms = query_parse(
            'tool:create_ticket -state:succeeded "ticket closed" 3f9c -agent:"support bot"'
        )
        self.assertEqual(
            terms,
            [
                Term("tool", "create_ticket"),
                Term("state", "succeeded", negated=True),
                Term("", "ticket closed"),
                Term("", "3f9c"),
                Term("agent", "support bot", negated=True),
            ],
        )

    def test_it_keeps_colons_and_escaped_quotes_inside_quotes(self):
        self.assertEqual(query_parse('"HTTP 409: closed"'), [Term("", "HTTP 409: closed")])
        self.assertEqual(query_parse(r'"say \"no\""'), [Term("", 'say "no"')])
        self.assertEqual(query_parse('request:"a b:c"'), [Term("request", "a b:c")])

    def test_a_blank_query_has_no_terms(self):
        self.assertEqual(query_parse("   "), [])
        self.assertEqual(query_parse(""), [])

    def test_keys_are_case_insensitive_and_is_values_too(self):
        self.assertEqual(
            query_parse("TOOL:X is:Claimed"), [Term("tool", "X"), Term("is", "claimed")]
        )

    def test_malformed_queries_name_the_term(self):
        cases = {
            'tool:x "unclosed': ('"unclosed', "not closed"),
            "colour:red": ("colour:red", "unknown key 'colour'"),
            "reason:nonsense": ("reason:nonsense", "reason must be one of"),
            "state:done": ("state:done", "state must be one of"),
            "is:resolved": ("is:resolved", "is must be one of"),
            "-tool:": ("-tool:", "tool needs a value"),
            'trace:""': ('trace:""', "trace needs a value"),
            "request:" + "x" * 201: ("request:" + "x" * 201, "longer than 200"),
        }
        for query, (term, words) in cases.items():
            with self.subTest(query=query):
                with self.assertRaises(QueryError) as caught:
                    query_parse(query)
                self.assertEqual(caught.exception.term, term)
                self.assertIn(words, caught.exception.message)

    def test_too_long_or_too_many_terms_is_refused(self):
        with self.assertRaises(QueryError):
            query_parse("x" * (search.MAX_QUERY + 1))
        with self.assertRaises(QueryError) as caught:
            query_parse(" ".join(f"t{i}" for i in range(search.MAX_TERMS + 1)))
        self.assertEqual(caught.exception.term, f"t{search.MAX_TERMS}")

    def test_choices_can_be_widened(self):
        with self.assertRaises(QueryError):
            query_parse("category:not_ok")
        self.assertEqual(
            query_parse("category:not_ok", choices=selectors.SEARCH_CHOICES),
            [Term("category", "not_ok")],
        )

    @given(
        st.lists(
            st.builds(
                Term,
                key=st.sampled_from(["", "tool", "agent", "request", "trace", "conversation"]),
                value=st.text(
                    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1
                ).filter(lambda v: v.strip() and len(v) <= search.MAX_VALUE),
                negated=st.booleans(),
            ),
            max_size=6,
        )
    )
    def test_any_terms_written_out_read_back_the_same(self, terms):
        text = query_text(terms)
        if len(text) <= search.MAX_QUERY:
            self.assertEqual(query_parse(text), terms)

    @given(st.text(max_size=300))
    def test_any_text_parses_or_raises_query_error(self, text):
        try:
            terms = query_parse(text)
        except QueryError as exc:
            self.assertTrue(exc.term)
            return
        for term in terms:
            self.assertIn(term.key, ("", *search.KEYS))
            self.assertTrue(term.value.strip())


class SearchDataMixin:
    """Calls whose every searched field differs, and review items of some of them."""

    @classmethod
    def seed(cls):
        now = timezone.now()
        cls.helper = Agent.objects.create(project=cls.project, name="helper bot")
        specs = [
            ("create_ticket", Reason.OK, "succeeded", cls.agent, ""),
            ("create_ticket", Reason.CONFLICT, "failed", cls.agent, "HTTP 409: Ticket closed"),
            ("search_orders", Reason.RATE_LIMITED, "retry_wait", cls.helper, "429 rate limit hit"),
            ("search_orders", Reason.OUTCOME_UNKNOWN, "in_review", cls.agent, "Timed out"),
            ("issue_refund", Reason.OUTCOME_UNKNOWN, "in_review", cls.helper, "timed OUT again"),
        ]
        cls.calls = []
        for i, (tool, reason, state, agent, observation) in enumerate(specs):
            cls.calls.append(
                make_call(
                    project=cls.project,
                    agent=agent,
                    created_at=now - timedelta(minutes=i),
                    tool=tool,
                    reason=reason,
                    state=state,
                    observation=observation,
                    request_id=f"req-{i}",
                    conversation_id=f"conv-{i % 2}",
                    trace_id=f"{i:032x}",
                )
            )
        # another tenant's call sharing every value: never found
        cls.foreign = make_call(
            project=cls.other_project,
            agent=cls.other_agent,
            created_at=now,
            tool="create_ticket",
            observation="HTTP 409: Ticket closed",
            request_id="req-1",
        )


class CallsSearchTests(SearchDataMixin, BaseTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.seed()

    def found(self, query: str) -> set[int]:
        terms = selectors.search_parse(query)
        qs = selectors.calls_filtered(project=self.project, filters=CallFilters(search=terms))
        return set(qs.values_list("pk", flat=True))

    def expect(self, predicate) -> set[int]:
        return {c.pk for c in self.calls if predicate(c)}

    def test_each_key_and_its_negation(self):
        first = self.calls[1]
        cases = {
            "tool:create_ticket": lambda c: c.tool_name == "create_ticket",
            'agent:"helper bot"': lambda c: c.agent_id == self.helper.pk,
            "reason:outcome_unknown": lambda c: c.reason == "outcome_unknown",
            "category:transient": lambda c: c.category == "transient",
            "category:not_ok": lambda c: c.category not in ("", "ok", "empty_result"),
            "route:review": lambda c: c.route == "review",
            "state:in_review": lambda c: c.state == "in_review",
            "request:req-2": lambda c: c.request_id == "req-2",
            f"operation:{first.operation_id[:8]}": lambda c: c.operation_id.startswith(
                first.operation_id[:8]
            ),
            "conversation:conv-1": lambda c: c.conversation_id == "conv-1",
            f"trace:{first.trace_id}": lambda c: c.trace_id == first.trace_id,
        }
        self.assertEqual(TABLE[Reason.RATE_LIMITED][0], "transient")
        for query, predicate in cases.items():
            with self.subTest(query=query):
                wanted = self.expect(predicate)
                self.assertTrue(wanted)
                self.assertEqual(self.found(query), wanted)
                self.assertEqual(
                    self.found("-" + query), self.expect(lambda c, p=predicate: not p(c))
                )

    def test_free_text_matches_an_id_or_the_error_text(self):
        self.assertEqual(self.found("req-3"), {self.calls[3].pk})
        self.assertEqual(self.found(self.calls[2].trace_id), {self.calls[2].pk})
        self.assertEqual(self.found("conv-0"), self.expect(lambda c: c.conversation_id == "conv-0"))
        self.assertEqual(self.found(self.calls[4].operation_id), {self.calls[4].pk})
        # the error text, anywhere in it, whatever the case
        self.assertEqual(self.found('"ticket closed"'), {self.calls[1].pk})
        self.assertEqual(self.found("timed out"), {self.calls[3].pk, self.calls[4].pk})
        self.assertEqual(
            self.found('-"timed out"'),
            self.expect(lambda c: "timed out" not in c.observation.lower()),
        )

    def test_terms_combine_with_and_and_with_the_filter_bar(self):
        self.assertEqual(self.found("tool:search_orders -state:retry_wait"), {self.calls[3].pk})
        terms = selectors.search_parse("reason:outcome_unknown")
        qs = selectors.calls_filtered(
            project=self.project, filters=CallFilters(search=terms, tool="issue_refund")
        )
        self.assertEqual(list(qs), [self.calls[4]])

    def test_review_item_keys_are_refused_on_the_calls_list(self):
        for query in ("is:open", "assignee:me"):
            with self.subTest(query=query), self.assertRaises(QueryError) as caught:
                selectors.search_parse(query)
            self.assertIn("review queue", caught.exception.message)

    def test_the_api_takes_the_same_language(self):
        response = self.api().get("/api/v1/calls", {"q": 'tool:create_ticket "ticket closed"'})
        self.assertEqual(response.status_code, 200, response.content)
        self.assertEqual(
            [i["operation_id"] for i in response.json()["items"]], [self.calls[1].operation_id]
        )
        response = self.api().get("/api/v1/calls", {"q": "-tool:create_ticket"})
        self.assertEqual(
            {i["operation_id"] for i in response.json()["items"]},
            # the key's agent's calls alone: the API reads no other agent's
            {
                c.operation_id
                for c in self.calls
                if c.tool_name != "create_ticket" and c.agent_id == self.agent.pk
            },
        )

    def test_the_api_answers_a_malformed_query_with_400_naming_the_term(self):
        for query, term in (
            ("tool:x colour:red", "colour:red"),
            ('"open quote', '"open quote'),
            ("state:nope", "state:nope"),
            ("is:open", "is:open"),
        ):
            with self.subTest(query=query):
                response = self.api().get("/api/v1/calls", {"q": query})
                self.assertEqual(response.status_code, 400, response.content)
                body = response.json()
                self.assertEqual(body["errors"][0]["loc"], "q")
                self.assertIn(term, body["errors"][0]["msg"])

    def test_the_calls_page_searches_and_names_a_bad_term_with_400(self):
        self.client.force_login(self.alice)
        url = f"/p/{self.project.slug}/calls/"
        response = self.client.get(url, {"q": '"ticket closed"'})
        self.assertEqual(response.status_code, 200)
        self.assertContains(response, f'id="call-{self.calls[1].pk}"')
        self.assertNotContains(response, f'id="call-{self.calls[0].pk}"')
        self.assertContains(response, '<span class="num">1</span> matching', html=False)
        response = self.client.get(url, {"q": "tool:x colour:red"})
        self.assertEqual(response.status_code, 400)
        self.assertContains(response, "colour:red", status_code=400)
        self.assertContains(response, "unknown key", status_code=400)

    def test_the_calls_page_hands_an_item_search_to_the_queue(self):
        self.client.force_login(self.alice)
        response = self.client.get(f"/p/{self.project.slug}/calls/", {"q": "is:claimed tool:x"})
        self.assertRedirects(
            response,
            f"/p/{self.project.slug}/review/?q=is%3Aclaimed+tool%3Ax",
            fetch_redirect_response=False,
        )


class QueueSearchTests(SearchDataMixin, BaseTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.seed()
        now = timezone.now()
        cls.items = [
            make_review_item(cls.calls[1]),
            make_review_item(
                cls.calls[3],
                status=ReviewItem.Status.CLAIMED,
                assignee=cls.alice,
                lease_expires_at=now + timedelta(minutes=10),
            ),
            make_review_item(
                cls.calls[4],
                status=ReviewItem.Status.CLAIMED,
                assignee=cls.bob,
                lease_expires_at=now + timedelta(minutes=10),
            ),
        ]

    def found(self, query: str, user=None) -> set[int]:
        filters = queue.QueueFilters.from_query({"q": query, "status": "all"})
        self.assertEqual(filters.search_error, "")
        user = user or self.alice
        items = queue.queue_items(project=self.project, filters=filters, user=user)
        counted = queue.QueueCounts.read(project=self.project, filters=filters, user=user)
        found = set(items.values_list("pk", flat=True))
        self.assertEqual(counted.matching, len(found), query)  # the count is of the same items
        return found

    def test_item_keys_call_keys_free_text_and_negation(self):
        a, b, c = (i.pk for i in self.items)
        cases = {
            "tool:search_orders": {b},
            'agent:"helper bot"': {c},
            "reason:outcome_unknown": {b, c},
            "is:open": {a, b, c},
            "is:claimed": {b, c},
            "assignee:me": {b},
            "assignee:bob": {c},
            "assignee:unassigned": {a},
            "state:failed": {a},
            "category:unknown_outcome": {b, c},
            "request:req-4": {c},
            "conversation:conv-1": {a, b},
            '"ticket closed"': {a},
            '"timed out"': {b, c},
        }
        for query, wanted in cases.items():
            with self.subTest(query=query):
                self.assertEqual(self.found(query), wanted)
                self.assertEqual(self.found("-" + query), {a, b, c} - wanted)

    def test_a_name_nobody_has_matches_nothing_and_its_negation_everything(self):
        everything = {i.pk for i in self.items}
        for key in ("agent", "tool", "assignee", "request"):
            with self.subTest(key=key):
                self.assertEqual(self.found(f"{key}:nobody"), set())
                self.assertEqual(self.found(f"-{key}:nobody"), everything)

    def test_bulk_all_matching_acts_on_the_search_s_items_only(self):
        self.client.force_login(self.maria)
        response = self.client.post(
            f"/p/{self.project.slug}/review/bulk/",
            {"action": "assign", "all_matching": "1", "q": '"ticket closed"', "assignee": "bob"},
        )
        self.assertEqual(response.status_code, 302)
        self.assertIn("q=%22ticket+closed%22", response["Location"])
        a, b, c = (ReviewItem.objects.get(pk=i.pk) for i in self.items)
        self.assertEqual(a.assignee, self.bob)
        self.assertEqual((b.assignee, c.assignee), (self.alice, self.bob))  # as they were

    def test_the_queue_page_takes_q_and_names_a_bad_term_with_400(self):
        self.client.force_login(self.alice)
        url = f"/p/{self.project.slug}/review/"
        response = self.client.get(url, {"q": "assignee:bob"})
        self.assertEqual(response.status_code, 200)
        self.assertContains(response, f'id="item-{self.items[2].pk}"')
        self.assertNotContains(response, f'id="item-{self.items[1].pk}"')
        response = self.client.get(url, {"q": 'tool:"x'})
        self.assertEqual(response.status_code, 400)
        self.assertContains(response, "not closed", status_code=400)
