"""matchmaking end to end through the gateway, against real accounts-service, social-service,
matchmaking-service and gateway processes: grpcio stubs generated from Proto/, and Connect JSON
over HTTP/1.1 (urllib). The game journey (two friends, a challenge notified live, both watching,
played to a win, stats and ratings, a rematch, a replay equal to what was played), a random-queue
pairing of two players of close rating, and a quit."""
import json
import os
import queue
import threading
import time
import urllib.error
import urllib.request
import uuid

import grpc
import pytest

from conftest import BIN, Proc, free_port

PASSWORD = "correct horse battery staple"


@pytest.fixture
def game(tmp_path, stubs):
    for exe in ("social-service", "matchmaking-service"):
        if not (BIN / exe).exists():
            pytest.skip(f"{exe} is not built")
    ports = {n: free_port() for n in ("accounts", "social", "matchmaking", "gateway")}
    env = dict(os.environ)
    env.update({
        "DATA_DIR": str(tmp_path),
        "SERVICE_TOKEN": "e2e-service-credential-0123456789abcdef",
        "GATEWAY_TOKEN": "e2e-gateway-credential-0123456789abcdef",
        "ACCOUNTS_ADDR": f"127.0.0.1:{ports['accounts']}",
        "SOCIAL_ADDR": f"127.0.0.1:{ports['social']}",
        "MATCHMAKING_ADDR": f"127.0.0.1:{ports['matchmaking']}",
        "TASKS_ADDR": f"127.0.0.1:{free_port()}",
        "FINANCE_ADDR": f"127.0.0.1:{free_port()}",
        "GATEWAY_UPSTREAMS": "accounts,social,matchmaking",
        "ACCOUNTS_SCRYPT_N": "1024",
        "LOG_LEVEL": "info",
        # A client that vanished without closing is found by PING within ~2 s here (10 s + 5 s by default).
        "MATCHMAKING_KEEPALIVE_TIME_MS": "1000",
        "MATCHMAKING_KEEPALIVE_TIMEOUT_MS": "1000",
    })
    procs = []
    try:
        for name in ("accounts", "social", "matchmaking"):
            procs.append(Proc(f"{name}-service", ["--host", "127.0.0.1", "--port", str(ports[name]),
                                                  "--data-dir", str(tmp_path / name)], env, ports[name]).start())
        procs.append(Proc("gateway", ["--host", "127.0.0.1", "--port", str(ports["gateway"])], env, ports["gateway"]).start())
        from accounts.v1 import accounts_pb2, accounts_pb2_grpc
        from social.v1 import social_pb2, social_pb2_grpc
        from matchmaking.v1 import matchmaking_pb2, matchmaking_pb2_grpc

        gw = grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}")
        yield {
            "apb": accounts_pb2, "spb": social_pb2, "pb": matchmaking_pb2,
            "accounts": accounts_pb2_grpc.AccountsStub(gw),
            "social": social_pb2_grpc.SocialStub(gw),
            "mm": matchmaking_pb2_grpc.MatchmakingStub(gw),
            "mm_internal_via_gateway": matchmaking_pb2_grpc.MatchmakingInternalStub(gw),
            "gateway_port": ports["gateway"],
            "matchmaking_port": ports["matchmaking"],
            "stubs_path": [p for p in __import__("sys").path if "e2e-stubs-" in p][0],
            "procs": procs,
        }
        gw.close()
    finally:
        for p in reversed(procs):
            p.stop()


def auth(token):
    return [("authorization", f"Bearer {token}")]


def sign_up(ctx, prefix):
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    r = ctx["accounts"].SignUp(ctx["apb"].SignUpRequest(username=name, email=f"{name}@example.com", password=PASSWORD,
                                                        display_name=prefix.capitalize()), timeout=10)
    return {"id": r.user.user_id, "username": name, "token": r.session.access_token}


def connect(ctx, method, body, user=None):
    req = urllib.request.Request(f"http://127.0.0.1:{ctx['gateway_port']}/matchmaking.v1.Matchmaking/{method}",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    if user:
        req.add_header("Authorization", f"Bearer {user['token']}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Stream:
    """A server stream read on a thread; elements land in a queue."""

    def __init__(self, call):
        self.call, self.items, self.error = call, queue.Queue(), None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        try:
            for e in self.call:
                self.items.put(e)
        except grpc.RpcError as e:
            self.error = e
        self.items.put(None)

    def take(self, pred, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                e = self.items.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            if e is None:
                raise AssertionError(f"stream ended: {self.error}")
            if pred(e):
                return e
        raise AssertionError("no matching element in time")

    def drain_until_end(self, timeout=20):
        out = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            e = self.items.get(timeout=max(0.01, deadline - time.time()))
            if e is None:
                return out
            out.append(e)
        raise AssertionError("stream did not end")


# ---- the rules, client side (a player's app computes its own legal move) ---------------------

OFFSETS = {1: [(0, 0)], 2: [(0, 0), (1, 0)], 3: [(0, 0), (1, 0), (2, 0)], 4: [(0, 0), (0, 1), (1, 0)],
           5: [(0, 0), (1, 0), (2, 0), (3, 0)], 6: [(0, 0), (1, 0), (0, 1), (1, 1)], 7: [(0, 0), (1, 0), (2, 0), (1, 1)],
           8: [(0, 0), (0, 1), (0, 2), (1, 0)], 9: [(0, 0), (1, 0), (1, 1), (1, 2)], 10: [(0, 0), (1, 0), (1, 1), (2, 1)],
           11: [(1, 0), (2, 0), (0, 1), (1, 1)]}


def turned(kind, q):
    cells = OFFSETS[kind]
    for _ in range(q):
        cells = [(r, -c) for c, r in cells]
    mc, mr = min(c for c, _ in cells), min(r for _, r in cells)
    return [(c - mc, r - mr) for c, r in cells]


def has_path(start, goal, blocked, cols, rows):
    seen, todo = {start}, [start]
    while todo:
        c, r = todo.pop()
        if r == goal:
            return True
        for dc, dr in ((0, 1), (0, -1), (1, 0), (-1, 0)):
            n = (c + dc, r + dr)
            if 0 <= n[0] < cols and 0 <= n[1] < rows and n not in blocked and n not in seen:
                seen.add(n)
                todo.append(n)
    return False


def legal_move(pb, m):
    b = m.board
    cols, rows = b.columns, b.rows
    blocked = {(c.column, c.row) for s in b.shapes for c in s.cells}
    first, second = (b.first_avatar.column, b.first_avatar.row), (b.second_avatar.column, b.second_avatar.row)
    avoid = {first[0], second[0], first[0] - 1, first[0] + 1}
    choice = None
    for strict in (True, False):
        for q in range(4):
            for r in range(rows):
                for c in range(cols):
                    cells = [(c + dc, r + dr) for dc, dr in turned(m.next_shape, q)]
                    if any(not (0 <= x < cols and 0 <= y < rows) or (x, y) in blocked or (x, y) in (first, second) for x, y in cells):
                        continue
                    if strict and any(x in avoid for x, _ in cells):
                        continue
                    nb = blocked | set(cells)
                    if has_path(first, rows - 1, nb, cols, rows) and has_path(second, 0, nb, cols, rows):
                        choice = (c, r, q, nb)
                        break
                if choice: break
            if choice: break
        if choice: break
    req = pb.SubmitMoveRequest(match_id=m.match_id, turn_number=m.turn_number)
    if choice:
        c, r, q, blocked = choice
        req.placement.kind = m.next_shape
        req.placement.anchor.column, req.placement.anchor.row, req.placement.quarter_turns = c, r, q
    me, other, goal, order = (first, second, rows - 1, [(pb.DIRECTION_UP, 0, 1), (pb.DIRECTION_RIGHT, 1, 0)]) \
        if m.seat_to_move == pb.SEAT_FIRST else (second, first, 0, [(pb.DIRECTION_DOWN, 0, -1), (pb.DIRECTION_LEFT, -1, 0)])
    at = me
    for _ in range(3):
        if at[1] == goal:
            break
        for d, dc, dr in order:
            n = (at[0] + dc, at[1] + dr)
            if 0 <= n[0] < cols and 0 <= n[1] < rows and n not in blocked and n != other:
                req.steps.append(d)
                at = n
                break
        else:
            break
    return req


def play_out(ctx, m, first, second):
    moves = []
    while m.status == ctx["pb"].MATCH_STATUS_ACTIVE:
        p = first if m.seat_to_move == ctx["pb"].SEAT_FIRST else second
        r = ctx["mm"].SubmitMove(legal_move(ctx["pb"], m), metadata=auth(p["token"]), timeout=10)
        moves.append(r.move)
        m = r.match
    return moves, m


# ---- journeys ----------------------------------------------------------------------------------

def test_the_game_journey(game):
    pb, spb, mm, s = game["pb"], game["spb"], game["mm"], game["social"]
    ann, ben = sign_up(game, "ann"), sign_up(game, "ben")
    s.AddFriend(spb.AddFriendRequest(user=spb.UserSelector(username=ben["username"])), metadata=auth(ann["token"]), timeout=10)

    # Ben listens to his notifications: the challenge arrives live.
    notes = Stream(s.SubscribeNotifications(spb.SubscribeNotificationsRequest(), metadata=auth(ben["token"]), timeout=60))
    ch = mm.CreateChallenge(pb.CreateChallengeRequest(idempotency_key=str(uuid.uuid4()), opponent_username=ben["username"], rated=True,
                                                      message="best of one?"), metadata=auth(ann["token"]), timeout=10).challenge
    note = notes.take(lambda e: e.HasField("notification") and e.notification.kind == spb.NOTIFICATION_KIND_CHALLENGE)
    assert note.notification.target.challenge_id == ch.challenge_id
    notes.call.cancel()

    accepted = mm.AcceptChallenge(pb.AcceptChallengeRequest(challenge_id=ch.challenge_id), metadata=auth(ben["token"]), timeout=10)
    m = accepted.match
    assert m.first.user.user_id == ann["id"] and m.rated and m.kind == pb.MATCH_KIND_CHALLENGE

    # Both watch through the gateway.
    wa = Stream(mm.WatchMatch(pb.WatchMatchRequest(match_id=m.match_id), metadata=auth(ann["token"]), timeout=120))
    wb = Stream(mm.WatchMatch(pb.WatchMatchRequest(match_id=m.match_id), metadata=auth(ben["token"]), timeout=120))
    wa.take(lambda e: e.HasField("snapshot"))
    wb.take(lambda e: e.HasField("snapshot"))
    # An illegal move is refused with the field named.
    bad = legal_move(pb, m)
    bad.steps[:] = [pb.DIRECTION_DOWN]
    with pytest.raises(grpc.RpcError) as e:
        mm.SubmitMove(bad, metadata=auth(ann["token"]), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "steps[0]" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        mm.SubmitMove(legal_move(pb, m), metadata=auth(ben["token"]), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    played, final = play_out(game, m, ann, ben)
    assert final.status == pb.MATCH_STATUS_FINISHED and final.outcome.reason == pb.MATCH_END_REASON_GOAL_REACHED
    for w in (wa, wb):
        over = w.take(lambda e: e.HasField("match_over"))
        assert over.match_over.outcome.winner == final.outcome.winner
    winner, loser = (ann, ben) if final.outcome.winner == pb.SEAT_FIRST else (ben, ann)

    # Stats and ratings changed.
    ws = mm.GetPlayerStats(pb.GetPlayerStatsRequest(), metadata=auth(winner["token"]), timeout=10).stats
    assert ws.wins == 1 and ws.matches_played == 1 and ws.rating.rating > 1500 and ws.rating.provisional
    lr = mm.GetRating(pb.GetRatingRequest(user_id=loser["id"]), metadata=auth(winner["token"]), timeout=10)
    assert lr.rating.rating < 1500 and lr.rating.deviation < 350

    # Rematch: both agree; the watchers see it and their streams end with OK.
    assert mm.RequestRematch(pb.RequestRematchRequest(match_id=m.match_id), metadata=auth(loser["token"]), timeout=10).state == pb.REMATCH_STATE_WAITING
    started = mm.RequestRematch(pb.RequestRematchRequest(match_id=m.match_id), metadata=auth(winner["token"]), timeout=10)
    assert started.state == pb.REMATCH_STATE_STARTED and started.new_match.first.user.user_id == ben["id"]
    for w in (wa, wb):
        rest = w.drain_until_end()
        assert any(e.HasField("rematch") and e.rematch.state == pb.REMATCH_STATE_STARTED for e in rest)
        assert w.error is None

    # The replay equals what was played (grpcio and JSON).
    rp = mm.GetMatchReplay(pb.GetMatchReplayRequest(match_id=m.match_id), metadata=auth(ann["token"]), timeout=10)
    assert [mv.turn_number for mv in rp.moves] == [mv.turn_number for mv in played]
    assert [list(mv.steps) for mv in rp.moves] == [list(mv.steps) for mv in played]
    assert [list(mv.placement.cells) for mv in rp.moves] == [list(mv.placement.cells) for mv in played]
    assert len(rp.dealt_shapes) == len(played) and rp.match.board == final.board
    status, body = connect(game, "GetMatchReplay", {"matchId": m.match_id}, ann)
    assert status == 200 and len(body["moves"]) == len(played)
    status, body = connect(game, "GetLeaderboard", {"pageSize": 5}, ann)
    assert status == 200 and body.get("rankedPlayers", 0) == 0  # two provisional players: nobody ranked yet
    status, body = connect(game, "SubmitMove", {"matchId": m.match_id, "turnNumber": 0}, ann)
    assert status == 400 and "turn_number" in json.dumps(body)

    # The internal API is not reachable through the gateway.
    with pytest.raises(grpc.RpcError) as e:
        game["mm_internal_via_gateway"].EraseUser(pb.EraseUserRequest(event_id="x", user_id=ann["id"]), timeout=10)
    assert e.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND)


def test_random_queue_pairs_close_ratings_and_a_quit(game):
    pb, mm = game["pb"], game["mm"]
    cat, dan, eve = sign_up(game, "cat"), sign_up(game, "dan"), sign_up(game, "eve")
    # Eve joins and leaves by closing her stream: nobody is paired with a ghost.
    qe = Stream(mm.JoinQueue(pb.JoinQueueRequest(), metadata=auth(eve["token"]), timeout=60))
    first = qe.take(lambda e: True)
    assert first.state == pb.QUEUE_STATE_SEARCHING and first.ticket_id and first.window_min_rating == 1450
    qe.call.cancel()
    time.sleep(0.5)

    qc = Stream(mm.JoinQueue(pb.JoinQueueRequest(), metadata=auth(cat["token"]), timeout=60))
    qc.take(lambda e: e.state == pb.QUEUE_STATE_SEARCHING)
    qd = Stream(mm.JoinQueue(pb.JoinQueueRequest(), metadata=auth(dan["token"]), timeout=60))
    mc = qc.take(lambda e: e.state == pb.QUEUE_STATE_MATCHED)
    md = qd.take(lambda e: e.state == pb.QUEUE_STATE_MATCHED)
    assert mc.match_id == md.match_id and mc.opponent.user_id == dan["id"] and md.opponent.user_id == cat["id"]
    assert qc.drain_until_end() == [] and qc.error is None

    m = mm.GetMatch(pb.GetMatchRequest(match_id=mc.match_id), metadata=auth(cat["token"]), timeout=10).match
    assert m.kind == pb.MATCH_KIND_RANDOM and m.rated and eve["id"] not in (m.first.user.user_id, m.second.user.user_id)

    # Dan quits: a loss for him, a win for Cat, both rated.
    watcher = Stream(mm.WatchMatch(pb.WatchMatchRequest(match_id=m.match_id), metadata=auth(cat["token"]), timeout=60))
    watcher.take(lambda e: e.HasField("snapshot"))
    q = mm.QuitMatch(pb.QuitMatchRequest(match_id=m.match_id), metadata=auth(dan["token"]), timeout=10).match
    assert q.outcome.reason == pb.MATCH_END_REASON_QUIT and len(q.outcome.rating_changes) == 2
    over = watcher.take(lambda e: e.HasField("match_over"))
    assert over.match_over.outcome.loser_by_forfeit == (pb.SEAT_FIRST if m.first.user.user_id == dan["id"] else pb.SEAT_SECOND)
    ds = mm.GetPlayerStats(pb.GetPlayerStatsRequest(), metadata=auth(dan["token"]), timeout=10).stats
    assert ds.losses == 1 and ds.quits == 1 and ds.rating.rating < 1500
    watcher.call.cancel()


def test_a_vanished_queued_client_is_never_paired(game):
    """A client joins the queue straight on matchmaking (no gateway between), then its process is
    frozen (SIGSTOP: the connection stays open, nothing answers). The server's keepalive PING finds
    it and its ticket goes: a player who joins later is not paired with the ghost."""
    import signal
    import subprocess
    import sys
    pb, mm = game["pb"], game["mm"]
    ghost, real, other = sign_up(game, "ghost"), sign_up(game, "real"), sign_up(game, "other")
    script = f"""
import sys, grpc
sys.path.insert(0, {game['stubs_path']!r})
from matchmaking.v1 import matchmaking_pb2 as pb, matchmaking_pb2_grpc as rpc
ch = grpc.insecure_channel("127.0.0.1:{game['matchmaking_port']}")
md = [("authorization", "Bearer {ghost['token']}"), ("x-gateway-token", "e2e-gateway-credential-0123456789abcdef")]
for e in rpc.MatchmakingStub(ch).JoinQueue(pb.JoinQueueRequest(), metadata=md, timeout=120):
    print(pb.QueueState.Name(e.state), flush=True)
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "QUEUE_STATE_SEARCHING"
        p.send_signal(signal.SIGSTOP)
        time.sleep(5)  # keepalive 1 s + 1 s, with room
        q = Stream(mm.JoinQueue(pb.JoinQueueRequest(), metadata=auth(real["token"]), timeout=60))
        q.take(lambda e: e.state == pb.QUEUE_STATE_SEARCHING)
        time.sleep(2)
        assert q.items.empty() or all(e is not None and e.state == pb.QUEUE_STATE_SEARCHING for e in list(q.items.queue))
        # A real opponent is paired at once.
        q2 = Stream(mm.JoinQueue(pb.JoinQueueRequest(), metadata=auth(other["token"]), timeout=60))
        m1 = q.take(lambda e: e.state == pb.QUEUE_STATE_MATCHED)
        m2 = q2.take(lambda e: e.state == pb.QUEUE_STATE_MATCHED)
        assert m1.opponent.user_id == other["id"] and m2.opponent.user_id == real["id"]
    finally:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()


# ---- the whole cascade under scripts/run -----------------------------------------------------------

@pytest.mark.parametrize("internal_tls", [False, True], ids=["h2c", "mutual-tls"])
def test_account_deletion_cascades_to_every_service_under_scripts_run(tmp_path, stubs, internal_tls):
    """All five services and the gateway started by scripts/run (the built binaries in BIN_DIR);
    deleting an account reaches every service: accounts' outbox shows the event acknowledged by
    each destination, and the user is gone or anonymised in social, finance, tasks and matchmaking.
    With INTERNAL_TLS=1 every call between the processes (the gateway's relays, peer reads, outbox
    deliveries) is mutual TLS with the development cluster CA, and a service takes no caller
    without a certificate of it."""
    import signal
    import sqlite3
    import subprocess
    from conftest import ROOT

    for exe in ("accounts-service", "social-service", "tasks-service", "finance-service", "matchmaking-service", "gateway",
                "dev-certs"):
        if not (BIN / exe).exists():
            pytest.skip(f"{exe} is not built")
    ports = {n: free_port() for n in ("gateway", "accounts", "tasks", "finance", "social", "matchmaking")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEER_TLS_")}
    env.update({f"{n.upper()}_PORT": str(p) for n, p in ports.items()})
    env.update({"DATA_DIR": str(tmp_path / "data"), "BIN_DIR": str(BIN), "NO_BUILD": "1", "LOG_LEVEL": "warning",
                "ACCOUNTS_SCRYPT_N": "1024", "INTERNAL_TLS": "1" if internal_tls else "0"})
    log = open(tmp_path / "run.log", "w+")
    run = subprocess.Popen([str(ROOT / "scripts" / "run")], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "gateway listening" not in (tmp_path / "run.log").read_text():
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.time() < deadline, "scripts/run did not start: " + (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(0.2)
        from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc
        from social.v1 import social_pb2 as spb, social_pb2_grpc
        from tasks.v1 import tasks_pb2_grpc, team_tasks_pb2 as ttpb
        from matchmaking.v1 import matchmaking_pb2 as pb, matchmaking_pb2_grpc

        if internal_tls:
            # The services' ports: a client with a certificate of the cluster CA gets in; plain
            # h2c and TLS without a certificate do not.
            from grpc_health.v1 import health_pb2, health_pb2_grpc
            certs = tmp_path / "data" / "tls" / "internal"
            def health(channel):
                return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
            read = lambda name: (certs / name).read_bytes()
            for name in ("accounts", "social", "tasks", "finance", "matchmaking"):
                target = f"127.0.0.1:{ports[name]}"
                good = grpc.secure_channel(target, grpc.ssl_channel_credentials(read("ca.pem"), read("probe-key.pem"), read("probe.pem")))
                assert health(good) == health_pb2.HealthCheckResponse.SERVING, name
                good.close()
                for refused in (grpc.insecure_channel(target), grpc.secure_channel(target, grpc.ssl_channel_credentials(read("ca.pem")))):
                    with pytest.raises(grpc.RpcError) as e:
                        health(refused)
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, name
                    refused.close()

        gw = grpc.insecure_channel(f"127.0.0.1:{ports['gateway']}")
        ctx = {"accounts": accounts_pb2_grpc.AccountsStub(gw), "apb": apb}
        social, tasks, mm = social_pb2_grpc.SocialStub(gw), tasks_pb2_grpc.TasksStub(gw), matchmaking_pb2_grpc.MatchmakingStub(gw)
        ann, bob = sign_up(ctx, "ann"), sign_up(ctx, "bob")

        # Bob's traces: a household and a charge (social, finance), a friendship (social), a team
        # task (tasks), a finished match and a rating (matchmaking).
        from finance.v1 import finance_pb2 as fpb, finance_pb2_grpc
        from common.v1 import types_pb2
        finance = finance_pb2_grpc.FinanceStub(gw)
        home = social.CreateHousehold(spb.CreateHouseholdRequest(name="Flat", invite_emails=[f"{bob['username']}@example.com"]),
                                      metadata=auth(ann["token"]), timeout=10)
        household = home.household.household_id
        social.JoinHousehold(spb.JoinHouseholdRequest(invite_code=home.invites[0].invite_code), metadata=auth(bob["token"]), timeout=10)
        finance.CreateCharge(fpb.CreateChargeRequest(household_id=household, description="Rent share",
                                                     amount=types_pb2.Money(amount_cents=1250, currency="EUR"),
                                                     split_mode=fpb.SPLIT_MODE_EQUAL, housemate_user_ids=[bob["id"]],
                                                     idempotency_key=uuid.uuid4().hex), metadata=auth(ann["token"]), timeout=10)
        social.AddFriend(spb.AddFriendRequest(user=spb.UserSelector(username=bob["username"])), metadata=auth(ann["token"]), timeout=10)
        task = tasks.CreateTeamTask(ttpb.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Shared",
                                                               participant_usernames=[bob["username"]]), metadata=auth(ann["token"]), timeout=10).task
        ch = mm.CreateChallenge(pb.CreateChallengeRequest(idempotency_key="c", opponent_username=bob["username"], rated=True),
                                metadata=auth(ann["token"]), timeout=10).challenge
        m = mm.AcceptChallenge(pb.AcceptChallengeRequest(challenge_id=ch.challenge_id), metadata=auth(bob["token"]), timeout=10).match
        mm.QuitMatch(pb.QuitMatchRequest(match_id=m.match_id), metadata=auth(bob["token"]), timeout=10)

        ctx["accounts"].DeleteAccount(apb.DeleteAccountRequest(password=PASSWORD), metadata=auth(bob["token"]), timeout=10)

        # accounts' outbox: the event acknowledged by every destination.
        db = tmp_path / "data" / "accounts" / "accounts.sqlite"
        def outbox():
            c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                return c.execute("SELECT destination, delivered_at FROM outbox WHERE kind LIKE '%UserDeleted%'").fetchall()
            finally:
                c.close()
        deadline = time.time() + 60
        while time.time() < deadline and not (outbox() and all(d is not None for _, d in outbox())):
            time.sleep(0.2)
        rows = outbox()
        assert {dest for dest, _ in rows} == {"social", "tasks", "finance", "matchmaking"}, rows
        assert all(d is not None for _, d in rows), rows

        # Service by service.
        # finance: ann keeps the entry and the balance, the counterpart shown as a deleted user.
        balances = finance.GetBalances(fpb.GetBalancesRequest(household_id=household), metadata=auth(ann["token"]), timeout=10).balances
        owed = [b for b in balances if b.amount.amount_cents == 1250]
        assert len(owed) == 1 and owed[0].counterpart.display_name == "Deleted user" and owed[0].counterpart.username == "", balances
        friends = social.ListFriends(spb.ListFriendsRequest(), metadata=auth(ann["token"]), timeout=10)
        assert bob["id"] not in str(friends)
        t = tasks.GetTeamTask(ttpb.GetTeamTaskRequest(task_id=task.task_id), metadata=auth(ann["token"]), timeout=10).task
        assert [p.user.user_id for p in t.participants] == [ann["id"]]
        got = mm.GetMatch(pb.GetMatchRequest(match_id=m.match_id), metadata=auth(ann["token"]), timeout=10).match
        assert got.second.user.user_id == "" and got.second.user.display_name == "Deleted player"
        with pytest.raises(grpc.RpcError) as e:
            mm.GetRating(pb.GetRatingRequest(user_id=bob["id"]), metadata=auth(ann["token"]), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert mm.GetPlayerStats(pb.GetPlayerStatsRequest(), metadata=auth(ann["token"]), timeout=10).stats.wins == 1
        gw.close()
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
