"""tasks part 2 end to end through the gateway, with grpcio stubs generated from Proto/ and Connect JSON
over HTTP/1.1, against real accounts-service, social-service, finance-service, tasks-service and gateway
processes: the GeoTask journey of seed D (post at real places, search by words within 5 km sorted by
distance, bid, a live notification, accept, done, the settlement in finance's balances) and the habit
journey of seed C (follow each other, habits, events with a photo and a place, the feeds, today's
to-do, streaks)."""
import base64
import uuid

import grpc
import pytest

from tasks_cluster import auth, eventually, start_cluster
from test_tasks_e2e import Subscription, connect

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000100000001008060000001ff3ff610000001949444154789c63f80f040c0c0cff81808181"
                    "e13f03001cf003fd9a1e8ea10000000049454e44ae426082")
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00H\x00H\x00\x00\xff\xd9"


@pytest.fixture
def cluster(tmp_path, stubs):
    c = start_cluster(tmp_path, with_finance=True)
    yield c
    c.stop()


def test_geotask_journey(cluster):
    c = cluster
    from common.v1 import types_pb2
    from finance.v1 import finance_pb2, finance_pb2_grpc
    from tasks.v1 import marketplace_pb2 as mp
    spb = c.spb
    finance = finance_pb2_grpc.FinanceStub(c.gw)
    alice, bob = c.sign_up("alice", "Alice Martin"), c.sign_up("bob", "Bob Kowalski")

    def post(title, lat, lon, description=""):
        return c.tasks.CreateMarketTask(mp.CreateMarketTaskRequest(idempotency_key=uuid.uuid4().hex, title=title, description=description,
                                                                   location=types_pb2.GeoPoint(latitude=lat, longitude=lon), photos=[JPEG]),
                                        metadata=auth(alice), timeout=10).task

    # The requester posts at real places in Edmonton (and one in Calgary, one without the words).
    desk = post("Assemble IKEA desk", 53.5232, -113.5263, "MALM desk, tools on site")   # 3.3 km from bob
    chair = post("Desk chair to assemble", 53.5461, -113.4938)                           # 0.3 km
    post("Assemble a desk", 51.0447, -114.0719)                                           # Calgary, 280 km
    post("Walk my dog", 53.5440, -113.4910)                                               # no keyword
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.CreateMarketTask(mp.CreateMarketTaskRequest(idempotency_key="bad", title="x" * 31, photos=[b"<svg/>"]),
                                 metadata=auth(alice), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "title" in e.value.details() and "photos[0]" in e.value.details()

    # The provider searches by words within 5 km: both found, nearest first (grpcio and JSON).
    here = types_pb2.GeoPoint(latitude=53.5444, longitude=-113.4909)
    found = c.tasks.SearchMarketTasks(mp.SearchMarketTasksRequest(keywords="desk assemble", near=here,
                                                                  max_distance_km={"value": 5.0}), metadata=auth(bob), timeout=10).results
    assert [r.task.task_id for r in found] == [chair.task_id, desk.task_id]
    assert 0.2 < found[0].distance_km.value < 0.4 and 3.2 < found[1].distance_km.value < 3.4
    status, body = connect(c, "tasks.v1.Tasks/SearchMarketTasks", {"keywords": "DESK", "near": {"latitude": 53.5444, "longitude": -113.4909},
                                                                    "maxDistanceKm": 5}, bob)
    assert status == 200 and [r["task"]["taskId"] for r in body["results"]] == [chair.task_id, desk.task_id]
    photo = c.tasks.GetMarketTaskPhoto(mp.GetMarketTaskPhotoRequest(task_id=desk.task_id, photo_id=desk.photos[0].photo_id),
                                       metadata=auth(bob), timeout=10)
    assert photo.data == JPEG and photo.photo.content_type == "image/jpeg"

    # bob bids; alice, subscribed, hears it live.
    sub = Subscription(c, alice)
    try:
        bid = c.tasks.PlaceBid(mp.PlaceBidRequest(idempotency_key=uuid.uuid4().hex, task_id=desk.task_id,
                                                  amount=types_pb2.Money(amount_cents=4500, currency="CAD")),
                               metadata=auth(bob), timeout=10)
        assert bid.task_status == mp.MARKET_TASK_STATUS_BIDDED
        n = sub.next(spb.NOTIFICATION_KIND_NEW_BID)
        assert n.actor.user_id == bob["id"] and n.target.task_id == desk.task_id and "45.00 CAD" in n.body
    finally:
        sub.close()
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.PlaceBid(mp.PlaceBidRequest(idempotency_key="own", task_id=desk.task_id, amount=types_pb2.Money(amount_cents=1, currency="CAD")),
                         metadata=auth(alice), timeout=10)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # alice accepts (JSON) and marks it done.
    status, body = connect(c, "tasks.v1.Tasks/AcceptBid", {"bidId": bid.bid.bid_id}, alice)
    assert status == 200 and body["task"]["status"] == "MARKET_TASK_STATUS_ASSIGNED"
    assert body["task"]["acceptedBid"]["provider"]["userId"] == bob["id"]
    mine = c.tasks.ListMarketTasks(mp.ListMarketTasksRequest(scope=mp.MARKET_TASK_SCOPE_ASSIGNED_TO_ME), metadata=auth(bob), timeout=10).tasks
    assert [t.task_id for t in mine] == [desk.task_id]
    done = c.tasks.MarkMarketTaskDone(mp.MarkMarketTaskDoneRequest(task_id=desk.task_id), metadata=auth(alice), timeout=10).task
    assert done.status == mp.MARKET_TASK_STATUS_DONE and done.HasField("done_at")

    # Both see the settlement in finance: alice owes bob 45.00 CAD, once.
    def balance(user):
        bs = finance.GetBalances(finance_pb2.GetBalancesRequest(), metadata=auth(user), timeout=10).balances
        return [(b.counterpart.user_id, b.amount.amount_cents, b.amount.currency) for b in bs]
    assert eventually(lambda: balance(alice) == [(bob["id"], -4500, "CAD")])
    assert balance(bob) == [(alice["id"], 4500, "CAD")]
    again = c.tasks.MarkMarketTaskDone(mp.MarkMarketTaskDoneRequest(task_id=desk.task_id), metadata=auth(alice), timeout=10).task
    assert again == done
    status, body = connect(c, "finance.v1.Finance/ListTransactions", {"counterpartUserId": alice["id"]}, bob)
    assert status == 200 and [e["taskId"] for e in body["entries"]] == [desk.task_id]
    assert body["entries"][0]["kind"] == "TRANSACTION_KIND_SETTLEMENT"


def test_habit_journey(cluster):
    c = cluster
    from common.v1 import types_pb2
    from tasks.v1 import habits_pb2 as hp
    spb = c.spb
    alice, bob = c.sign_up("alice", "Alice Martin"), c.sign_up("bob", "Bob Kowalski")

    # They follow each other (request, accept).
    for follower, followed in ((alice, bob), (bob, alice)):
        c.social.RequestFollow(spb.RequestFollowRequest(user=spb.UserSelector(username=followed["username"])), metadata=auth(follower),
                               timeout=10)
        c.social.AcceptFollowRequest(spb.AcceptFollowRequestRequest(requester_user_id=follower["id"]), metadata=auth(followed), timeout=10)

    every_day = list(range(1, 8))
    zone = "Europe/Berlin"

    def habit(user, title):
        return c.tasks.CreateHabit(hp.CreateHabitRequest(idempotency_key=uuid.uuid4().hex, title=title, reason="Feel better", days=every_day,
                                                         time_zone=zone), metadata=auth(user), timeout=10).habit

    run, read = habit(alice, "Morning run"), habit(alice, "Read 20 pages")
    swim = habit(bob, "Swim")
    assert run.metrics.due_today and not run.metrics.done_today and run.metrics.current_streak == 0

    # Events with a photo and a place (one per habit per day).
    river = types_pb2.GeoPoint(latitude=52.5200, longitude=13.4050)
    ev = c.tasks.CreateHabitEvent(hp.CreateHabitEventRequest(idempotency_key=uuid.uuid4().hex, habit_id=run.habit_id, comment="5k by the river",
                                                             photo=PNG, location=river, time_zone=zone), metadata=auth(alice), timeout=10).event
    assert ev.photo == PNG and ev.photo_size_bytes == len(PNG) and ev.location.latitude == 52.52
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.CreateHabitEvent(hp.CreateHabitEventRequest(idempotency_key=uuid.uuid4().hex, habit_id=run.habit_id, time_zone=zone),
                                 metadata=auth(alice), timeout=10)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS and ev.event_id in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.CreateHabitEvent(hp.CreateHabitEventRequest(idempotency_key=uuid.uuid4().hex, habit_id=read.habit_id, comment="c" * 21,
                                                            photo=b"x" * 70000, time_zone=zone), metadata=auth(alice), timeout=10)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    status, body = connect(c, "tasks.v1.Tasks/CreateHabitEvent", {"idempotencyKey": uuid.uuid4().hex, "habitId": swim.habit_id,
                                                                   "comment": "40 lengths", "photo": base64.b64encode(PNG).decode(),
                                                                   "location": {"latitude": 52.51, "longitude": 13.40}, "timeZone": zone}, bob)
    assert status == 200 and body["event"]["photoSizeBytes"] == len(PNG)

    # Each sees the other's feed (the latest event per habit), never the photos unless asked.
    feed = c.tasks.ListHabitHistory(hp.ListHabitHistoryRequest(scope=hp.HABIT_HISTORY_SCOPE_FOLLOWING), metadata=auth(bob), timeout=10).events
    assert [(e.habit_title, e.owner.user_id, e.photo) for e in feed] == [("Morning run", alice["id"], b"")]
    feed = c.tasks.ListHabitHistory(hp.ListHabitHistoryRequest(scope=hp.HABIT_HISTORY_SCOPE_FOLLOWING, include_photos=True),
                                    metadata=auth(alice), timeout=10).events
    assert [(e.habit_title, e.photo) for e in feed] == [("Swim", PNG)]
    followed = c.tasks.ListFollowedHabits(hp.ListFollowedHabitsRequest(time_zone=zone), metadata=auth(bob), timeout=10).habits
    assert [h.title for h in followed] == ["Morning run", "Read 20 pages"]
    near = c.tasks.ListHabitHistory(hp.ListHabitHistoryRequest(scope=hp.HABIT_HISTORY_SCOPE_ALL,
                                                               near=hp.HabitHistoryNear(center=river, radius_km=0)),
                                    metadata=auth(alice), timeout=10).events
    assert sorted(e.habit_title for e in near) == ["Morning run", "Swim"]  # both within 5 km of the river

    # Today's to-do: not done first; streaks.
    status, today = connect(c, "tasks.v1.Tasks/ListTodayHabits", {"timeZone": zone}, alice)
    assert status == 200 and [h["habit"]["title"] for h in today["habits"]] == ["Read 20 pages", "Morning run"]
    assert today["habits"][1]["todayEventId"] == ev.event_id and today["habits"][1]["habit"]["metrics"]["currentStreak"] == 1
    got = c.tasks.GetHabit(hp.GetHabitRequest(habit_id=run.habit_id, time_zone=zone), metadata=auth(bob), timeout=10).habit
    assert got.metrics.current_streak == 1 and got.metrics.longest_streak == 1 and got.metrics.completion_rate == 1.0

    # A follower reads, never changes.
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.DeleteHabit(hp.DeleteHabitRequest(habit_id=run.habit_id), metadata=auth(bob), timeout=10)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # A block ends it: bob no longer sees alice's habits.
    c.social.BlockUser(spb.BlockUserRequest(user=spb.UserSelector(user_id=bob["id"])), metadata=auth(alice), timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.GetHabit(hp.GetHabitRequest(habit_id=run.habit_id), metadata=auth(bob), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert c.tasks.ListFollowedHabits(hp.ListFollowedHabitsRequest(), metadata=auth(bob), timeout=10).habits == []
