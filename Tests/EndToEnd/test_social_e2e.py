"""social end to end through the gateway, against real accounts-service, social-service and gateway
processes: grpcio stubs generated from Proto/, and Connect JSON over HTTP/1.1 (urllib). Invite codes
are read from the mail sink through accounts' AccountsInternal/ListSentMail, called on accounts
directly with the service credential (the gateway never routes internal services)."""
import json
import queue
import threading
import time
import urllib.error
import urllib.request
import uuid

import grpc
import pytest

PASSWORD = "correct horse battery staple"


@pytest.fixture
def social(system, stubs):
    if system["social"] is None:
        pytest.skip("social-service is not built")
    from accounts.v1 import accounts_pb2, accounts_pb2_grpc
    from social.v1 import social_pb2, social_pb2_grpc

    gw = grpc.insecure_channel(f"127.0.0.1:{system['gateway'].port}")
    direct = grpc.insecure_channel(f"127.0.0.1:{system['accounts'].port}")
    ctx = {
        "system": system,
        "apb": accounts_pb2,
        "spb": social_pb2,
        "accounts": accounts_pb2_grpc.AccountsStub(gw),
        "social": social_pb2_grpc.SocialStub(gw),
        "social_internal_via_gateway": social_pb2_grpc.SocialInternalStub(gw),
        "mail": accounts_pb2_grpc.AccountsInternalStub(direct),
        "service_token": system["env"]["SERVICE_TOKEN"],
    }
    yield ctx
    gw.close()
    direct.close()


def auth(token):
    return [("authorization", f"Bearer {token}")]


def sign_up(ctx, prefix):
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    r = ctx["accounts"].SignUp(ctx["apb"].SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD,
                                                        display_name=prefix.capitalize()), timeout=10)
    return {"id": r.user.user_id, "username": name, "email": f"{name}@example.com", "token": r.session.access_token}


def invite_code(ctx, email, timeout=10):
    """The newest household invite code mailed to `email` (mails go out through social's outbox)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        mails = ctx["mail"].ListSentMail(ctx["apb"].ListSentMailRequest(to_email=email, kind=ctx["apb"].MAIL_KIND_HOUSEHOLD_INVITE),
                                         metadata=[("x-service-token", ctx["service_token"])], timeout=10).mails
        if mails:
            return mails[0].data["invite_code"]
        time.sleep(0.05)
    raise AssertionError(f"no invite mail to {email}")


def code_of(e):
    return e.value.code()


# ---- grpcio ------------------------------------------------------------------------------------

def test_household_journey_grpc(social):
    s, pb = social["social"], social["spb"]
    a, b, c = sign_up(social, "anna"), sign_up(social, "ben"), sign_up(social, "cleo")
    created = s.CreateHousehold(pb.CreateHouseholdRequest(name="Maple Street 12", invite_emails=[b["email"], c["email"]]),
                                metadata=auth(a["token"]), timeout=10)
    hid = created.household.household_id
    assert [m.user.user_id for m in created.household.members] == [a["id"]]
    assert [i.email for i in created.invites] == [b["email"], c["email"]]
    for u in (b, c):
        joined = s.JoinHousehold(pb.JoinHouseholdRequest(invite_code=invite_code(social, u["email"])), metadata=auth(u["token"]), timeout=10)
        assert joined.household.household_id == hid
    with pytest.raises(grpc.RpcError) as e:
        s.JoinHousehold(pb.JoinHouseholdRequest(invite_code="ZZZZ-ZZZZ"), metadata=auth(c["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.NOT_FOUND
    renamed = s.RenameHousehold(pb.RenameHouseholdRequest(household_id=hid, name="The Maple House"), metadata=auth(b["token"]), timeout=10)
    assert renamed.household.name == "The Maple House"
    with pytest.raises(grpc.RpcError) as e:
        s.RenameHousehold(pb.RenameHouseholdRequest(household_id=hid, name=" "), metadata=auth(b["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT and "name" in e.value.details()
    mates = s.ListHousemates(pb.ListHousematesRequest(household_id=hid), metadata=auth(a["token"]), timeout=10)
    assert [m.user.username for m in mates.housemates] == [a["username"], b["username"], c["username"]]
    # The profile answers while tasks is down, saying the chore list is unavailable.
    profile = s.GetHousemateProfile(pb.GetHousemateProfileRequest(household_id=hid, user_id=b["id"]), metadata=auth(a["token"]), timeout=10)
    assert profile.housemate.user.username == b["username"] and profile.assigned_chores_unavailable
    assert not s.RemoveHousemate(pb.RemoveHousemateRequest(household_id=hid, user_id=c["id"]), metadata=auth(a["token"]), timeout=10).household_deleted
    assert not s.RemoveHousemate(pb.RemoveHousemateRequest(household_id=hid, user_id=b["id"]), metadata=auth(b["token"]), timeout=10).household_deleted
    s.DeleteHousehold(pb.DeleteHouseholdRequest(household_id=hid), metadata=auth(a["token"]), timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        s.GetHousehold(pb.GetHouseholdRequest(household_id=hid), metadata=auth(a["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.NOT_FOUND
    kinds = [n.kind for n in s.ListNotifications(pb.ListNotificationsRequest(), metadata=auth(c["token"]), timeout=10).notifications]
    assert pb.NOTIFICATION_KIND_HOUSEHOLD_REMOVED in kinds and pb.NOTIFICATION_KIND_HOUSEHOLD_INVITE in kinds


def test_friend_and_block_journey_grpc(social):
    s, pb = social["social"], social["spb"]
    a, m = sign_up(social, "anna"), sign_up(social, "mal")
    f = s.AddFriend(pb.AddFriendRequest(user=pb.UserSelector(username=m["username"].upper())), metadata=auth(a["token"]), timeout=10)
    assert f.friendship.user.user_id == m["id"]
    assert [x.user.user_id for x in s.ListFriends(pb.ListFriendsRequest(), metadata=auth(m["token"]), timeout=10).friends] == [a["id"]]
    s.BlockUser(pb.BlockUserRequest(user=pb.UserSelector(user_id=m["id"])), metadata=auth(a["token"]), timeout=10)
    assert not s.ListFriends(pb.ListFriendsRequest(), metadata=auth(a["token"]), timeout=10).friends
    with pytest.raises(grpc.RpcError) as e:
        s.AddFriend(pb.AddFriendRequest(user=pb.UserSelector(username=a["username"])), metadata=auth(m["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        s.RequestFollow(pb.RequestFollowRequest(user=pb.UserSelector(username=a["username"])), metadata=auth(m["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        s.AddFriend(pb.AddFriendRequest(user=pb.UserSelector(username="nobody_" + uuid.uuid4().hex[:6])), metadata=auth(a["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.NOT_FOUND
    blocked = s.ListBlockedUsers(pb.ListBlockedUsersRequest(), metadata=auth(a["token"]), timeout=10).blocked
    assert [x.user.username for x in blocked] == [m["username"]]
    s.UnblockUser(pb.UnblockUserRequest(user=pb.UserSelector(username=m["username"])), metadata=auth(a["token"]), timeout=10)
    assert not s.ListFriends(pb.ListFriendsRequest(), metadata=auth(a["token"]), timeout=10).friends  # not restored
    # The internal API is not reachable through the gateway.
    with pytest.raises(grpc.RpcError) as e:
        social["social_internal_via_gateway"].CheckRelationship(pb.CheckRelationshipRequest(user_id=a["id"], other_user_id=m["id"]), timeout=10)
    assert code_of(e) in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED)


def test_follow_journey_grpc(social):
    s, pb = social["social"], social["spb"]
    a, c = sign_up(social, "anna"), sign_up(social, "cleo")
    req = s.RequestFollow(pb.RequestFollowRequest(user=pb.UserSelector(username=c["username"])), metadata=auth(a["token"]), timeout=10)
    assert req.request.target.user_id == c["id"]
    with pytest.raises(grpc.RpcError) as e:
        s.RequestFollow(pb.RequestFollowRequest(user=pb.UserSelector(username=c["username"])), metadata=auth(a["token"]), timeout=10)
    assert code_of(e) == grpc.StatusCode.ALREADY_EXISTS
    incoming = s.ListFollowRequests(pb.ListFollowRequestsRequest(), metadata=auth(c["token"]), timeout=10).requests
    assert [r.requester.user_id for r in incoming] == [a["id"]]
    s.AcceptFollowRequest(pb.AcceptFollowRequestRequest(requester_user_id=a["id"]), metadata=auth(c["token"]), timeout=10)
    assert [x.user.user_id for x in s.ListFollowers(pb.ListFollowersRequest(), metadata=auth(c["token"]), timeout=10).followers] == [a["id"]]
    assert [x.user.user_id for x in s.ListFollowing(pb.ListFollowingRequest(), metadata=auth(a["token"]), timeout=10).following] == [c["id"]]
    s.Unfollow(pb.UnfollowRequest(user=pb.UserSelector(user_id=c["id"])), metadata=auth(a["token"]), timeout=10)
    assert not s.ListFollowing(pb.ListFollowingRequest(), metadata=auth(a["token"]), timeout=10).following


def test_a_deleted_account_is_erased_from_social_through_accounts_outbox(social):
    s, pb, apb = social["social"], social["spb"], social["apb"]
    a, b = sign_up(social, "anna"), sign_up(social, "ben")
    s.AddFriend(pb.AddFriendRequest(user=pb.UserSelector(user_id=b["id"])), metadata=auth(a["token"]), timeout=10)
    s.RequestFollow(pb.RequestFollowRequest(user=pb.UserSelector(user_id=a["id"])), metadata=auth(b["token"]), timeout=10)
    social["accounts"].DeleteAccount(apb.DeleteAccountRequest(password=PASSWORD), metadata=auth(b["token"]), timeout=10)
    # accounts.v1.UserDeleted reaches social's EraseUser through accounts' outbox.
    deadline = time.time() + 15
    while time.time() < deadline:
        friends = s.ListFriends(pb.ListFriendsRequest(), metadata=auth(a["token"]), timeout=10).friends
        requests = s.ListFollowRequests(pb.ListFollowRequestsRequest(), metadata=auth(a["token"]), timeout=10).requests
        if not friends and not requests:
            break
        time.sleep(0.1)
    assert not friends and not requests
    # b's notification to a (FRIEND_ADDED went to b; FOLLOW_REQUEST to a) keeps its text, loses the actor.
    notes = s.ListNotifications(pb.ListNotificationsRequest(), metadata=auth(a["token"]), timeout=10).notifications
    assert [n.kind for n in notes] == [pb.NOTIFICATION_KIND_FOLLOW_REQUEST] and not notes[0].HasField("actor")


class Subscription:
    """A live SubscribeNotifications read by a thread into a queue."""

    def __init__(self, ctx, user, after=""):
        pb = ctx["spb"]
        self.call = ctx["social"].SubscribeNotifications(pb.SubscribeNotificationsRequest(after_notification_id=after),
                                                         metadata=auth(user["token"]), timeout=60)
        self.items = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        first = self.items.get(timeout=10)
        assert not isinstance(first, Exception) and first.WhichOneof("event") == "started", first
        self.started = first.started

    def _read(self):
        try:
            for element in self.call:
                self.items.put(element)
        except grpc.RpcError as e:
            self.items.put(e)

    def next_notification(self, timeout):
        element = self.items.get(timeout=timeout)
        assert not isinstance(element, Exception), element
        assert element.WhichOneof("event") == "notification", element
        return element.notification

    def quiet(self, seconds=0.3):
        try:
            element = self.items.get(timeout=seconds)
        except queue.Empty:
            return True
        return isinstance(element, grpc.RpcError) and element.code() == grpc.StatusCode.CANCELLED

    def cancel(self):
        self.call.cancel()
        self.thread.join(5)


def test_live_subscription_through_the_gateway_then_a_reconnect_gets_exactly_what_it_missed(social):
    s, pb = social["social"], social["spb"]
    bob = sign_up(social, "bob")
    others = [sign_up(social, "fan") for _ in range(4)]
    live = Subscription(social, bob)
    # Another user's action: bob is notified live, within a second of the action returning.
    t0 = time.monotonic()
    s.AddFriend(pb.AddFriendRequest(user=pb.UserSelector(username=bob["username"])), metadata=auth(others[0]["token"]), timeout=10)
    first = live.next_notification(timeout=1.0)
    latency = time.monotonic() - t0
    assert first.kind == pb.NOTIFICATION_KIND_FRIEND_ADDED and first.actor.user_id == others[0]["id"]
    print(f"live notification through the gateway: {latency * 1000:.1f} ms after the action")
    live.cancel()

    # Missed while disconnected: three follow requests; the reconnect gets each once, in order.
    for o in others[1:]:
        s.RequestFollow(pb.RequestFollowRequest(user=pb.UserSelector(user_id=bob["id"])), metadata=auth(o["token"]), timeout=10)
    again = Subscription(social, bob, after=first.notification_id)
    assert again.started.unread_count == 4
    missed = [again.next_notification(timeout=5) for _ in range(3)]
    assert [n.actor.user_id for n in missed] == [o["id"] for o in others[1:]]
    assert [n.notification_id for n in missed] == sorted(n.notification_id for n in missed)
    assert again.quiet()  # nothing repeated
    s.RemoveFriend(pb.RemoveFriendRequest(user=pb.UserSelector(user_id=others[0]["id"])), metadata=auth(bob["token"]), timeout=10)
    s.AddFriend(pb.AddFriendRequest(user=pb.UserSelector(user_id=bob["id"])), metadata=auth(others[2]["token"]), timeout=10)
    after = again.next_notification(timeout=5)
    assert after.kind == pb.NOTIFICATION_KIND_FRIEND_ADDED and after.actor.user_id == others[2]["id"]
    assert again.quiet()
    again.cancel()
    inbox = s.ListNotifications(pb.ListNotificationsRequest(), metadata=auth(bob["token"]), timeout=10)
    assert [n.notification_id for n in inbox.notifications][::-1] == [first.notification_id] + [n.notification_id for n in missed] + [after.notification_id]


# ---- Connect JSON (HTTP/1.1) ---------------------------------------------------------------------

def call(ctx, method, body, user=None):
    port = ctx["system"]["gateway"].port
    req = urllib.request.Request(f"http://127.0.0.1:{port}/social.v1.Social/{method}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    if user:
        req.add_header("Authorization", f"Bearer {user['token']}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def ok(result):
    status, body = result
    assert status == 200, body
    return body


def test_household_journey_json(social):
    a, b, c = sign_up(social, "anna"), sign_up(social, "ben"), sign_up(social, "cleo")
    created = ok(call(social, "CreateHousehold", {"name": "Flat 3", "inviteEmails": [b["email"], c["email"]]}, a))
    hid = created["household"]["householdId"]
    assert len(created["invites"]) == 2
    for u in (b, c):
        joined = ok(call(social, "JoinHousehold", {"inviteCode": invite_code(social, u["email"]).lower()}, u))
        assert joined["household"]["householdId"] == hid
    status, body = call(social, "JoinHousehold", {"inviteCode": invite_code(social, b["email"])}, c)
    assert status == 409 and body["code"] == "already_exists", body  # a member already
    status, body = call(social, "JoinHousehold", {"inviteCode": invite_code(social, b["email"])}, sign_up(social, "dan"))
    assert status == 400 and body["code"] == "failed_precondition", body  # a used code
    status, body = call(social, "CreateHousehold", {"name": "", "inviteEmails": ["nope"]}, a)
    assert status == 400 and body["code"] == "invalid_argument" and "name" in body["message"] and "invite_emails[0]" in body["message"], body
    assert ok(call(social, "RenameHousehold", {"householdId": hid, "name": "Flat Three"}, c))["household"]["name"] == "Flat Three"
    mates = ok(call(social, "ListHousemates", {"householdId": hid}, b))["housemates"]
    assert [m["user"]["userId"] for m in mates] == [a["id"], b["id"], c["id"]]
    assert ok(call(social, "RemoveHousemate", {"householdId": hid, "userId": b["id"]}, a)) == {}
    assert ok(call(social, "RemoveHousemate", {"householdId": hid, "userId": c["id"]}, c)) == {}
    ok(call(social, "DeleteHousehold", {"householdId": hid}, a))
    status, body = call(social, "GetHousehold", {"householdId": hid}, a)
    assert status == 404 and body["code"] == "not_found", body


def test_friend_block_and_follow_journeys_json(social):
    a, m, c = sign_up(social, "anna"), sign_up(social, "mal"), sign_up(social, "cleo")
    ok(call(social, "AddFriend", {"user": {"username": m["username"]}}, a))
    status, body = call(social, "AddFriend", {"user": {"username": m["username"]}}, a)
    assert status == 409 and body["code"] == "already_exists", body
    ok(call(social, "BlockUser", {"user": {"userId": m["id"]}}, a))
    assert ok(call(social, "ListFriends", {}, a)).get("friends", []) == []
    status, body = call(social, "RequestFollow", {"user": {"username": a["username"]}}, m)
    assert status == 403 and body["code"] == "permission_denied", body
    assert [x["user"]["userId"] for x in ok(call(social, "ListBlockedUsers", {}, a))["blocked"]] == [m["id"]]
    ok(call(social, "UnblockUser", {"user": {"username": m["username"]}}, a))
    status, body = call(social, "UnblockUser", {"user": {"username": m["username"]}}, a)
    assert status == 404, body

    ok(call(social, "RequestFollow", {"user": {"username": c["username"]}}, a))
    incoming = ok(call(social, "ListFollowRequests", {"direction": "FOLLOW_REQUEST_DIRECTION_INCOMING"}, c))["requests"]
    assert [r["requester"]["userId"] for r in incoming] == [a["id"]]
    ok(call(social, "AcceptFollowRequest", {"requesterUserId": a["id"]}, c))
    assert [x["user"]["userId"] for x in ok(call(social, "ListFollowers", {}, c))["followers"]] == [a["id"]]
    notes = ok(call(social, "ListNotifications", {"unreadOnly": True}, a))
    assert notes["unreadCount"] == 1 and notes["notifications"][0]["kind"] == "NOTIFICATION_KIND_FOLLOW_ACCEPTED", notes
    marked = ok(call(social, "MarkNotificationsRead", {"notificationIds": [notes["notifications"][0]["notificationId"]]}, a))
    assert marked["markedCount"] == 1 and marked.get("unreadCount", 0) == 0, marked
    assert ok(call(social, "MuteHelpNotifications", {"muted": True}, a))["settings"]["helpMuted"] is True
    snoozed = ok(call(social, "SnoozeNotifications", {"duration": "3600s"}, a))
    assert "snoozedUntil" in snoozed["settings"], snoozed


# ---- hostile numbers (issue 35) ------------------------------------------------------------------

def call_proto(ctx, method, body, token):
    """Connect with `application/proto`: the request's protobuf bytes as they are."""
    port = ctx["system"]["gateway"].port
    req = urllib.request.Request(f"http://127.0.0.1:{port}/social.v1.Social/{method}", data=body, method="POST",
                                 headers={"Content-Type": "application/proto", "Connect-Protocol-Version": "1",
                                          "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_a_guest_cannot_stop_social_with_out_of_range_times(social):
    """The fuzzer's request (read_up_to.seconds past Int64.max / 1000) trapped social-service
    (SIGILL) on the multiplication to milliseconds; now every out-of-range time or span is
    INVALID_ARGUMENT naming its field, over Connect proto, grpcio and Connect JSON alike."""
    from google.protobuf import duration_pb2, timestamp_pb2
    pb = social["spb"]
    guest = social["accounts"].CreateGuest(social["apb"].CreateGuestRequest(), timeout=10)
    token = guest.session.access_token
    status, body = call_proto(social, "MarkNotificationsRead", bytes.fromhex("120908f8a78dafba93b110"), token)
    assert status == 400 and body["code"] == "invalid_argument" and "read_up_to.seconds" in body["message"], body

    cases = [
        (9_223_372_036_854_776, 0, "read_up_to.seconds"), (-9_223_372_036_854_776, 0, "read_up_to.seconds"),
        (2**63 - 1, 0, "read_up_to.seconds"), (-2**63, 0, "read_up_to.seconds"),
        (253_402_300_800, 0, "read_up_to.seconds"),  # 10000-01-01T00:00:00Z
        (-62_135_596_801, 0, "read_up_to.seconds"),  # 0000-12-31T23:59:59Z
        (0, 1_000_000_000, "read_up_to.nanos"), (0, -1, "read_up_to.nanos"),
    ]
    for seconds, nanos, field in cases:
        req = pb.MarkNotificationsReadRequest(read_up_to=timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos))
        with pytest.raises(grpc.RpcError) as e:
            social["social"].MarkNotificationsRead(req, metadata=auth(token), timeout=10)
        assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details(), (seconds, nanos, e.value.details())
    for seconds, nanos in [(2**63 - 1, 0), (-2**63, 0), (1, -1), (0, 2**31 - 1), (-(2**63), -(2**31))]:
        req = pb.SnoozeNotificationsRequest(duration=duration_pb2.Duration(seconds=seconds, nanos=nanos))
        with pytest.raises(grpc.RpcError) as e:
            social["social"].SnoozeNotifications(req, metadata=auth(token), timeout=10)
        assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT and "duration" in e.value.details(), (seconds, nanos)

    # The edges of the range are valid times, and the process is still serving.
    for seconds, nanos in [(253_402_300_799, 999_999_999), (-62_135_596_800, 0)]:
        req = pb.MarkNotificationsReadRequest(read_up_to=timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos))
        assert social["social"].MarkNotificationsRead(req, metadata=auth(token), timeout=10).marked_count == 0
    status, body = call(social, "MarkNotificationsRead", {"readUpTo": "9999-12-31T23:59:59Z"}, {"token": token})
    assert status == 200, body
    assert social["system"]["social"].p.poll() is None, social["system"]["social"].tail()
