"""Two operators acting on one item at once: exactly one wins. Real concurrent transactions
on PostgreSQL (one connection per thread); skipped on other databases."""

from __future__ import annotations

import threading
import time
import unittest
from unittest import mock

from django.contrib.auth import get_user_model
from django.db import connection
from django.test import TransactionTestCase

from callgate.models import Agent, Membership, Project, ToolCall
from reviews import services
from reviews.models import ReviewAudit, ReviewItem, ReviewRollup
from tests.reviews.fixtures import REFUND_PROPOSED, make_item, make_refund_approval


@unittest.skipUnless(connection.vendor == "postgresql", "needs PostgreSQL row locks")
class ReviewConcurrentDecisionTests(TransactionTestCase):
    def setUp(self):
        self.project = Project.objects.create(slug="acme", name="Acme")
        User = get_user_model()
        self.alice = User.objects.create_user("alice", password="x")
        self.bob = User.objects.create_user("bob", password="x")
        for user in (self.alice, self.bob):
            Membership.objects.create(
                user=user, project=self.project, role=Membership.Role.OPERATOR
            )
        self.agent = Agent.objects.create(project=self.project, name="support-bot")

    def race(self, actions):
        """Run each action in its own thread and connection, all released at once.
        The winner holds its transaction open a moment so the loser really overlaps."""
        barrier = threading.Barrier(len(actions))
        outcomes: list = [None] * len(actions)
        original = services.core_services.call_apply_decision

        def slow_apply(**kwargs):
            time.sleep(0.4)  # inside the winner's transaction, after its UPDATE took the row lock
            return original(**kwargs)

        def run(i, action):
            try:
                barrier.wait()
                action()
                outcomes[i] = "won"
            except services.ReviewConflict as exc:
                outcomes[i] = exc
            except Exception as exc:  # pragma: no cover - shown in the assertion
                outcomes[i] = repr(exc)
            finally:
                connection.close()

        with mock.patch.object(services.core_services, "call_apply_decision", slow_apply):
            threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
        return outcomes

    def test_it_lets_exactly_one_of_two_decisions_win(self):
        item = make_item(self.project, self.agent, reason="retry_exhausted")
        a = ReviewItem.objects.select_related("call__contract").get(pk=item.pk)
        b = ReviewItem.objects.select_related("call__contract").get(pk=item.pk)
        outcomes = self.race(
            [
                lambda: services.review_item_decide(
                    item=a, user=self.alice, decision="reject", reason="No."
                ),
                lambda: services.review_item_decide(
                    item=b, user=self.bob, decision="mark_failed", reason="Broken."
                ),
            ]
        )
        assert sorted(o == "won" for o in outcomes) == [False, True], outcomes
        loser = next(o for o in outcomes if o != "won")
        assert isinstance(loser, services.ReviewConflict) and "already decided" in str(loser)
        item.refresh_from_db()
        call = ToolCall.objects.get(pk=item.call_id)
        assert item.status == "resolved" and call.decision == item.resolution
        assert (
            ReviewAudit.objects.filter(item=item, action__in=["reject", "mark_failed"]).count() == 1
        )
        assert call.events.filter(kind="decision").count() == 1

    def test_it_lets_exactly_one_of_two_approvals_with_edits_win(self):
        item = make_refund_approval(self.project, self.agent)
        a = ReviewItem.objects.select_related("call__contract").get(pk=item.pk)
        b = ReviewItem.objects.select_related("call__contract").get(pk=item.pk)
        outcomes = self.race(
            [
                lambda: services.review_item_decide(
                    item=a,
                    user=self.alice,
                    decision="approve",
                    arguments={**REFUND_PROPOSED, "amount": 80},
                ),
                lambda: services.review_item_decide(
                    item=b,
                    user=self.bob,
                    decision="approve",
                    arguments={**REFUND_PROPOSED, "amount": 50},
                ),
            ]
        )
        assert sorted(o == "won" for o in outcomes) == [False, True], outcomes
        winner = (self.alice, 80) if outcomes[0] == "won" else (self.bob, 50)
        call = ToolCall.objects.get(pk=item.call_id)
        assert (call.decided_by, call.arguments["amount"]) == winner
        edits = ReviewAudit.objects.filter(item=item, action="edit_arguments")
        assert [(e.actor, e.detail["arguments"][0]["to"]) for e in edits] == [winner]
        assert call.events.filter(kind="decision").count() == 1

    def test_it_lets_exactly_one_of_two_claims_win(self):
        item = make_item(self.project, self.agent)
        a = ReviewItem.objects.get(pk=item.pk)
        b = ReviewItem.objects.get(pk=item.pk)
        outcomes = self.race(
            [
                lambda: services.review_item_claim(item=a, user=self.alice),
                lambda: services.review_item_claim(item=b, user=self.bob),
            ]
        )
        assert sorted(o == "won" for o in outcomes) == [False, True], outcomes
        assert ReviewAudit.objects.filter(item=item, action="claim").count() == 1


@unittest.skipUnless(connection.vendor == "postgresql", "needs PostgreSQL row locks")
class ReviewTallyLockOrderTests(TransactionTestCase):
    """A closing adds to the review tallies after it locked the call, as an ingest batch does
    (its calls, then their items, then the cells): an approval expiring while a batch that
    holds its call settles another expired approval (same cells) waits, and both finish.
    Adding before the call deadlocked: the expiry held the cells and waited for the call."""

    def test_an_expiry_and_a_batch_settling_another_approval_both_finish(self):
        from datetime import timedelta

        from django.db import transaction
        from django.utils import timezone

        from callgate import escalation

        project = Project.objects.create(slug="acme", name="Acme")
        agent = Agent.objects.create(project=project, name="support-bot")
        x = make_item(project, agent, kind="approval")
        y = make_item(project, agent, kind="approval")
        ReviewItem.objects.filter(pk=x.pk).update(
            approval_expires_at=timezone.now() - timedelta(seconds=5)
        )
        ToolCall.objects.filter(pk=y.call_id).update(reason="approval_expired", state="failed")
        locked, proceed = threading.Event(), threading.Event()
        outcomes: dict = {}

        def batch() -> None:  # what the ingest engine does: lock its calls, then settle
            try:
                with transaction.atomic():
                    list(
                        ToolCall.objects.select_for_update()
                        .filter(pk__in=[x.call_id, y.call_id])
                        .order_by("pk")
                    )
                    locked.set()
                    proceed.wait(10)
                    settled = ToolCall.objects.get(pk=y.call_id)
                    outcomes["batch"] = escalation.review_items_settle_bulk(
                        calls=[settled], note_by_call={settled.pk: "expired"}
                    )
            except Exception as exc:  # pragma: no cover - shown in the assertion
                outcomes["batch"] = repr(exc)
            finally:
                connection.close()

        def expire() -> None:
            try:
                outcomes["expire"] = services.review_items_expire()
            except Exception as exc:  # pragma: no cover - shown in the assertion
                outcomes["expire"] = repr(exc)
            finally:
                connection.close()

        first = threading.Thread(target=batch)
        first.start()
        assert locked.wait(10)
        second = threading.Thread(target=expire)
        second.start()
        time.sleep(0.7)  # the expiry has closed its item and waits for the call
        proceed.set()
        first.join(20)
        second.join(20)
        assert outcomes == {"batch": 1, "expire": 1}, outcomes
        rows = {
            (r.status, r.dims, r.grain): r.items
            for r in ReviewRollup.objects.filter(project=project)
        }
        assert rows[("expired", "total", "day")] == 2


@unittest.skipUnless(connection.vendor == "postgresql", "needs concurrent transactions")
class QueueCountsSnapshotTests(TransactionTestCase):
    """The queue's counts read the open items and the closed ones' tally in one statement:
    an item another operator closes while the counts are being read is counted once, as
    open or as closed. Read apart, it was counted both open (first read) and closed
    (second read): "4 matching" over three items."""

    def test_an_item_closed_while_the_counts_are_read_is_counted_once(self):
        from reviews.models import ClosedItemCount
        from reviews.selectors import QueueCounts, QueueFilters, queue_items

        project = Project.objects.create(slug="acme", name="Acme")
        agent = Agent.objects.create(project=project, name="support-bot")
        alice = get_user_model().objects.create_user("alice", password="x")
        bob = get_user_model().objects.create_user("bob", password="x")
        for user in (alice, bob):
            Membership.objects.create(user=user, project=project, role=Membership.Role.OPERATOR)
        items = [make_item(project, agent) for _ in range(3)]
        errors: list = []

        def decide() -> None:  # another operator, on another connection, commits a close
            try:
                services.review_item_decide(
                    item=ReviewItem.objects.get(pk=items[0].pk),
                    user=bob,
                    decision="reject",
                    reason="Duplicate.",
                )
            except Exception as exc:  # pragma: no cover - shown in the assertion
                errors.append(repr(exc))
            finally:
                connection.close()

        tally = ClosedItemCount.objects.filter
        done: list = []

        def filter_after_a_close(*args, **kwargs):  # the close lands mid-read
            if not done:
                done.append(True)
                thread = threading.Thread(target=decide)
                thread.start()
                thread.join(10)
            return tally(*args, **kwargs)

        filters = QueueFilters(status="all")
        with mock.patch.object(ClosedItemCount.objects, "filter", filter_after_a_close):
            counts = QueueCounts.read(project=project, filters=filters, user=alice)
        assert done and not errors, errors
        listed = queue_items(project=project, filters=filters, user=alice).count()
        statuses = dict(counts.facets()["status"])
        assert counts.matching == listed == 3
        assert statuses["open"] + statuses["resolved"] == statuses["all"] == 3, statuses
        assert all(n >= 0 for _, n in counts.facets()["age"])
