"""tasks end to end through the gateway, with grpcio stubs generated from Proto/ and Connect JSON over
HTTP/1.1 (urllib), against real accounts-service, social-service, tasks-service and gateway
processes: the team journey of seed A and the chore journey of seed B, and accounts' deletion
event reaching tasks."""
import json
import queue
import threading
import urllib.error
import urllib.request
import uuid

import grpc
import pytest

from tasks_cluster import auth, eventually, start_cluster


@pytest.fixture
def cluster(tmp_path, stubs):
    c = start_cluster(tmp_path)
    yield c
    c.stop()


def connect(c, method, body, user=None):
    """A Connect JSON call through the gateway: (HTTP status, parsed body)."""
    headers = {"content-type": "application/json"}
    if user:
        headers["authorization"] = f"Bearer {user['token']}"
    req = urllib.request.Request(f"{c.gateway_url}/{method}", data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Subscription:
    """A live SubscribeNotifications stream through the gateway, read on a thread."""

    def __init__(self, c, user):
        self.items = queue.Queue()
        self.call = c.social.SubscribeNotifications(c.spb.SubscribeNotificationsRequest(), metadata=auth(user), timeout=120)
        self.started = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        assert self.started.wait(15), f"the subscription did not start: {self.error or 'no answer in 15 s'}"

    def run(self):
        try:
            for item in self.call:
                if item.HasField("started"):
                    self.started.set()
                elif item.HasField("notification"):
                    self.items.put(item.notification)
        except grpc.RpcError as e:
            self.error = f"{e.code()}: {e.details()}"

    def next(self, kind, timeout=15):
        while True:
            n = self.items.get(timeout=timeout)
            if n.kind == kind:
                return n

    def close(self):
        self.call.cancel()


def test_team_journey(cluster):
    c = cluster
    tt, spb = c.ttpb, c.spb
    alice, bob, carol = c.sign_up("alice", "Alice Martin"), c.sign_up("bob", "Bob Kowalski"), c.sign_up("carol", "Carol Ng")
    dave, erin = c.sign_up("dave"), c.sign_up("erin")
    # Two teams in social; the rival scores first.
    ours = c.social.CreateTeam(spb.CreateTeamRequest(name="Checkout squad", member_usernames=[bob["username"], carol["username"]]),
                               metadata=auth(alice), timeout=10).team
    c.social.CreateTeam(spb.CreateTeamRequest(name="Rivals", member_usernames=[erin["username"]]), metadata=auth(dave), timeout=10)
    rival_task = c.tasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Rival work"), metadata=auth(dave),
                                        timeout=10).task
    c.tasks.SetTeamTaskCompletion(tt.SetTeamTaskCompletionRequest(task_id=rival_task.task_id, completed=True), metadata=auth(dave), timeout=10)
    eventually(lambda: c.social.GetMyTeam(spb.GetMyTeamRequest(), metadata=auth(dave), timeout=10).team.score == 1)
    rank_before = c.social.GetMyTeam(spb.GetMyTeamRequest(), metadata=auth(alice), timeout=10).team.rank
    assert rank_before >= 2

    # A task for three (usernames resolved through accounts; an unknown one named).
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="x", participant_usernames=["no_such_user"]),
                               metadata=auth(alice), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "participant_usernames[0]" in e.value.details()
    task = c.tasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Prepare sprint 12 demo",
                                                           description="Record the checkout flow walkthrough.",
                                                           participant_usernames=[bob["username"], carol["username"]]),
                                  metadata=auth(alice), timeout=10).task
    assert task.participant_count == 3 and task.team_id == ours.team_id

    # bob is subscribed; comments (grpcio and JSON), then alice asks for help: it arrives live.
    sub = Subscription(c, bob)
    try:
        c.tasks.AddTeamTaskComment(tt.AddTeamTaskCommentRequest(idempotency_key="c1", task_id=task.task_id, text="I'll record the video"),
                                   metadata=auth(bob), timeout=10)
        status, body = connect(c, "tasks.v1.Tasks/AddTeamTaskComment",
                               {"idempotencyKey": "c2", "taskId": task.task_id, "text": "Screenshots are done"}, carol)
        assert status == 200 and body["comment"]["author"]["username"] == carol["username"]
        assert sub.next(spb.NOTIFICATION_KIND_TASK_COMMENT).actor.user_id == carol["id"]
        helped = c.tasks.RequestTeamTaskHelp(tt.RequestTeamTaskHelpRequest(task_id=task.task_id, message="Who can review the script?"),
                                             metadata=auth(alice), timeout=10)
        assert helped.notified_count == 2
        n = sub.next(spb.NOTIFICATION_KIND_HELP_REQUEST)
        assert n.body == "Who can review the script?" and n.actor.user_id == alice["id"] and n.target.task_id == task.task_id
    finally:
        sub.close()
    status, comments = connect(c, "tasks.v1.Tasks/ListTeamTaskComments", {"taskId": task.task_id}, alice)
    assert status == 200 and [x["text"] for x in comments["comments"]] == ["I'll record the video", "Screenshots are done"]

    # Completions one by one: "k of n".
    for k, u in enumerate((alice, bob, carol), start=1):
        status, body = connect(c, "tasks.v1.Tasks/SetTeamTaskCompletion", {"taskId": task.task_id, "completed": True}, u)
        assert status == 200 and body["task"]["completedCount"] == k and body["task"]["participantCount"] == 3
        assert body["task"]["status"] == ("TEAM_TASK_STATUS_COMPLETED" if k == 3 else "TEAM_TASK_STATUS_OPEN")
    # The team scores it once; a second small task puts it ahead of the rival.
    eventually(lambda: c.social.GetMyTeam(spb.GetMyTeamRequest(), metadata=auth(alice), timeout=10).team.score == 1)
    second = c.tasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Demo retro"), metadata=auth(bob),
                                    timeout=10).task
    c.tasks.SetTeamTaskCompletion(tt.SetTeamTaskCompletionRequest(task_id=second.task_id, completed=True), metadata=auth(bob), timeout=10)
    team = eventually(lambda: (t := c.social.GetMyTeam(spb.GetMyTeamRequest(), metadata=auth(alice), timeout=10).team).score == 2 and t)
    assert team.rank < rank_before and team.rank == 1
    lists = c.tasks.ListMyTeamTasks(tt.ListMyTeamTasksRequest(view=tt.TEAM_TASK_VIEW_COMPLETED), metadata=auth(carol), timeout=10)
    assert [t.task_id for t in lists.tasks] == [task.task_id]

    # A public link, read without any token: JSON and the page.
    link = c.tasks.CreateTeamTaskLink(tt.CreateTeamTaskLinkRequest(task_id=task.task_id), metadata=auth(carol), timeout=10)
    status, public = connect(c, "tasks.v1.Tasks/GetPublicTeamTask", {"linkToken": link.link_token})
    assert status == 200 and public["task"]["name"] == "Prepare sprint 12 demo"
    assert public["task"]["participantNames"] == ["Alice Martin", "Bob Kowalski", "Carol Ng"]
    assert public["task"]["status"] == "TEAM_TASK_STATUS_COMPLETED" and "completedAt" in public["task"]
    assert "taskId" not in public["task"] and "comments" not in public["task"]
    with urllib.request.urlopen(c.gateway_url + link.public_path, timeout=10) as r:
        page = r.read().decode()
        assert r.status == 200 and "Prepare sprint 12 demo" in page and "3 of 3 done" in page
    status, _ = connect(c, "tasks.v1.Tasks/GetPublicTeamTask", {"linkToken": "A" * 43})
    assert status == 404
    # The journal of all this verifies (operator's RPC, service credential, on tasks directly).
    v = c.tasks_internal.VerifyJournal(c.tpb.VerifyJournalRequest(), metadata=c.service_meta, timeout=30)
    assert v.intact and v.checked_entries > 8
    # The gateway never routes the internal API.
    with pytest.raises(grpc.RpcError) as e:
        from tasks.v1 import tasks_pb2_grpc
        tasks_pb2_grpc.TasksInternalStub(c.gw).VerifyJournal(c.tpb.VerifyJournalRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_chore_journey(cluster):
    c = cluster
    spb, cpb, types = c.spb, c.cpb, c.types
    anna, ben, cleo = c.sign_up("anna"), c.sign_up("ben"), c.sign_up("cleo")
    hh = c.social.CreateHousehold(spb.CreateHouseholdRequest(name="Maple Street 12", invite_emails=[ben["email"], cleo["email"]]),
                                  metadata=auth(anna), timeout=10).household.household_id
    for u in (ben, cleo):
        c.social.JoinHousehold(spb.JoinHouseholdRequest(invite_code=c.invite_code(u["email"])), metadata=auth(u), timeout=10)

    # A weekly chore for three, due today in UTC (the household's zone here).
    import datetime
    today = datetime.datetime.now(datetime.timezone.utc).date()
    due = types.Date(year=today.year, month=today.month, day=today.day)
    chore = c.tasks.CreateChore(cpb.CreateChoreRequest(idempotency_key=uuid.uuid4().hex, household_id=hh, name="Take out the trash",
                                                       due_date=due, assignee_user_ids=[anna["id"], ben["id"], cleo["id"]],
                                                       recurrence=cpb.ChoreRecurrence(weekly=cpb.ChoreWeekly()), time_zone="UTC"),
                                metadata=auth(anna), timeout=10).chore
    assert chore.current_assignee.user_id == anna["id"] and chore.revision == 1
    # An outsider sees nothing.
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.GetChore(cpb.GetChoreRequest(chore_id=chore.chore_id), metadata=auth(c.sign_up("mallory")), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND

    # Finish rotates anna → ben (a week later); two finishes with the same revision: one wins.
    finished = c.tasks.FinishChore(cpb.FinishChoreRequest(chore_id=chore.chore_id, expected_revision=1), metadata=auth(anna), timeout=10).chore
    week = today + datetime.timedelta(days=7)
    assert finished.current_assignee.user_id == ben["id"]
    assert (finished.due_date.year, finished.due_date.month, finished.due_date.day) == (week.year, week.month, week.day)
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.FinishChore(cpb.FinishChoreRequest(chore_id=chore.chore_id, expected_revision=1), metadata=auth(cleo), timeout=10)
    assert e.value.code() == grpc.StatusCode.ABORTED
    # ben skips: cleo's turn, same date (JSON this time).
    status, skipped = connect(c, "tasks.v1.Tasks/SkipChore", {"choreId": chore.chore_id, "expectedRevision": "2"}, ben)
    assert status == 200 and skipped["chore"]["currentAssignee"]["userId"] == cleo["id"]
    assert skipped["chore"]["dueDate"] == {"year": week.year, "month": week.month, "day": week.day}
    # cleo finishes: back to anna, two weeks on.
    again = c.tasks.FinishChore(cpb.FinishChoreRequest(chore_id=chore.chore_id, expected_revision=3), metadata=auth(cleo), timeout=10).chore
    assert again.current_assignee.user_id == anna["id"]
    # social's housemate profile asks tasks for anna's chores.
    profile = c.social.GetHousemateProfile(spb.GetHousemateProfileRequest(household_id=hh, user_id=anna["id"]), metadata=auth(ben), timeout=10)
    assert not profile.assigned_chores_unavailable and [x.name for x in profile.assigned_chores] == ["Take out the trash"]

    # ben reminds anna: a notification in her inbox; a second reminder within the hour is refused.
    sub = Subscription(c, anna)
    try:
        reminded = c.tasks.RemindChoreAssignee(cpb.RemindChoreAssigneeRequest(chore_id=chore.chore_id, message="Bins go out tonight"),
                                               metadata=auth(ben), timeout=10)
        assert reminded.reminded.user_id == anna["id"]
        n = sub.next(spb.NOTIFICATION_KIND_TASK_REMINDER)
        assert n.body == "Bins go out tonight" and n.actor.user_id == ben["id"]
    finally:
        sub.close()
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.RemindChoreAssignee(cpb.RemindChoreAssigneeRequest(chore_id=chore.chore_id), metadata=auth(cleo), timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # Deleting the household ends its chores (social → tasks through social's outbox).
    c.social.DeleteHousehold(spb.DeleteHouseholdRequest(household_id=hh), metadata=auth(cleo), timeout=10)
    ended = eventually(lambda: (x := c.tasks.GetChore(cpb.GetChoreRequest(chore_id=chore.chore_id), metadata=auth(anna), timeout=10).chore)
                       .status == cpb.CHORE_STATUS_ENDED and x)
    assert ended.status == cpb.CHORE_STATUS_ENDED
    with pytest.raises(grpc.RpcError) as e:
        c.tasks.FinishChore(cpb.FinishChoreRequest(chore_id=chore.chore_id), metadata=auth(anna), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_account_deletion_reaches_tasks(cluster):
    c = cluster
    tt = c.ttpb
    alice, bob = c.sign_up("alice"), c.sign_up("bob")
    task = c.tasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Shared",
                                                           participant_usernames=[bob["username"]]), metadata=auth(alice), timeout=10).task
    c.tasks.AddTeamTaskComment(tt.AddTeamTaskCommentRequest(idempotency_key="k", task_id=task.task_id, text="from bob"), metadata=auth(bob),
                               timeout=10)
    c.accounts.DeleteAccount(c.apb.DeleteAccountRequest(password=bob["password"]), metadata=auth(bob), timeout=10)
    # accounts' outbox delivers UserDeleted as tasks' EraseUser: bob leaves the task, his comment stays anonymised.
    got = eventually(lambda: (t := c.tasks.GetTeamTask(tt.GetTeamTaskRequest(task_id=task.task_id), metadata=auth(alice), timeout=10).task)
                     .participant_count == 1 and t, timeout=30)
    assert [p.user.user_id for p in got.participants] == [alice["id"]]
    comments = c.tasks.ListTeamTaskComments(tt.ListTeamTaskCommentsRequest(task_id=task.task_id), metadata=auth(alice), timeout=10).comments
    assert comments[0].text == "from bob" and comments[0].author.user_id == "" and comments[0].author.username == "deleted-user"
