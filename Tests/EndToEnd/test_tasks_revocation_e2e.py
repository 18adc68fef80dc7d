"""Access that must end with its revocation (issue 35, part 3), against real accounts-service,
social-service, tasks-service and gateway processes with tasks' production settings: a housemate
removed, one who left and a deleted household lose their chores the moment social answers, and a
deleted account's still-valid access token is refused by tasks once accounts' erasure reached it,
with nothing it wrote in between surviving. Each test prints what it measured (run with -s)."""
import datetime
import time
import uuid

import grpc
import pytest

from tasks_cluster import auth, eventually, start_cluster


@pytest.fixture
def cluster(tmp_path, stubs):
    c = start_cluster(tmp_path)
    yield c
    c.stop()


def household_with_chore(c, owner, member):
    spb, cpb, types = c.spb, c.cpb, c.types
    hh = c.social.CreateHousehold(spb.CreateHouseholdRequest(name="Flat", invite_emails=[member["email"]]), metadata=auth(owner),
                                  timeout=10).household.household_id
    c.social.JoinHousehold(spb.JoinHouseholdRequest(invite_code=c.invite_code(member["email"])), metadata=auth(member), timeout=10)
    today = datetime.datetime.now(datetime.timezone.utc).date()
    chore = c.tasks.CreateChore(cpb.CreateChoreRequest(idempotency_key=uuid.uuid4().hex, household_id=hh, name="Dishes",
                                                       due_date=types.Date(year=today.year, month=today.month, day=today.day),
                                                       assignee_user_ids=[owner["id"], member["id"]],
                                                       recurrence=cpb.ChoreRecurrence(every_n_days=cpb.ChoreEveryNDays(days=1)),
                                                       time_zone="UTC"), metadata=auth(owner), timeout=10).chore
    return hh, chore


def refused_for(c, user, hh, chore_id, seconds=12.0):
    """How long after now ListChores and FinishChore kept answering OK to `user` (0 when the first
    calls were refused), and the codes of the refusals."""
    cpb = c.cpb
    start = time.monotonic()
    last_ok = None
    codes = set()
    while time.monotonic() - start < seconds:
        answered = 0
        for call in (lambda: c.tasks.ListChores(cpb.ListChoresRequest(household_id=hh), metadata=auth(user), timeout=10),
                     lambda: c.tasks.FinishChore(cpb.FinishChoreRequest(chore_id=chore_id), metadata=auth(user), timeout=10)):
            try:
                call()
                answered += 1
                last_ok = time.monotonic() - start
            except grpc.RpcError as e:
                codes.add(e.code())
        if answered == 0:
            break
        time.sleep(0.05)
    return (last_ok or 0.0), codes


def test_a_removed_housemate_loses_the_chores_at_once(cluster):
    c = cluster
    anna, ben = c.sign_up("anna"), c.sign_up("ben")
    hh, chore = household_with_chore(c, anna, ben)
    # ben works with the household's chores (what tasks could have remembered about him).
    assert [x.chore_id for x in c.tasks.ListChores(c.cpb.ListChoresRequest(household_id=hh), metadata=auth(ben), timeout=10).chores] == [
        chore.chore_id]
    c.tasks.FinishChore(c.cpb.FinishChoreRequest(chore_id=chore.chore_id), metadata=auth(ben), timeout=10)
    c.social.RemoveHousemate(c.spb.RemoveHousemateRequest(household_id=hh, user_id=ben["id"]), metadata=auth(anna), timeout=10)
    window, codes = refused_for(c, ben, hh, chore.chore_id)
    print(f"\nremoved housemate: ListChores/FinishChore still answered OK for {window:.2f} s after RemoveHousemate returned")
    assert window == 0.0 and codes == {grpc.StatusCode.NOT_FOUND}
    # anna still works with it.
    c.tasks.ListChores(c.cpb.ListChoresRequest(household_id=hh), metadata=auth(anna), timeout=10)


def test_a_housemate_who_left_loses_the_chores_at_once(cluster):
    c = cluster
    anna, ben = c.sign_up("anna"), c.sign_up("ben")
    hh, chore = household_with_chore(c, anna, ben)
    c.tasks.ListChores(c.cpb.ListChoresRequest(household_id=hh), metadata=auth(ben), timeout=10)
    c.social.RemoveHousemate(c.spb.RemoveHousemateRequest(household_id=hh, user_id=ben["id"]), metadata=auth(ben), timeout=10)
    window, codes = refused_for(c, ben, hh, chore.chore_id)
    print(f"\nhousemate who left: ListChores/FinishChore still answered OK for {window:.2f} s after leaving")
    assert window == 0.0 and codes == {grpc.StatusCode.NOT_FOUND}


def test_a_deleted_household_takes_no_more_writes_at_once(cluster):
    c = cluster
    anna, ben = c.sign_up("anna"), c.sign_up("ben")
    hh, chore = household_with_chore(c, anna, ben)
    c.tasks.FinishChore(c.cpb.FinishChoreRequest(chore_id=chore.chore_id), metadata=auth(ben), timeout=10)
    c.social.DeleteHousehold(c.spb.DeleteHouseholdRequest(household_id=hh), metadata=auth(anna), timeout=10)
    # Before and after social's EndHouseholdChores reaches tasks alike: no chore write is taken.
    for user in (anna, ben):
        with pytest.raises(grpc.RpcError) as e:
            c.tasks.FinishChore(c.cpb.FinishChoreRequest(chore_id=chore.chore_id), metadata=auth(user), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    ended = eventually(lambda: (x := c.tasks.GetChore(c.cpb.GetChoreRequest(chore_id=chore.chore_id), metadata=auth(anna), timeout=10).chore)
                       .status == c.cpb.CHORE_STATUS_ENDED and x)
    assert ended.last_finished_by.user_id == ben["id"]


def test_a_deleted_accounts_token_is_refused_and_nothing_it_wrote_survives(cluster):
    c = cluster
    from tasks.v1 import habits_pb2 as hp
    from tasks.v1 import marketplace_pb2 as mp
    alice, bob = c.sign_up("alice"), c.sign_up("bob")
    before = c.tasks.CreateMarketTask(mp.CreateMarketTaskRequest(idempotency_key=uuid.uuid4().hex, title="Before"), metadata=auth(bob),
                                      timeout=10).task
    c.accounts.DeleteAccount(c.apb.DeleteAccountRequest(password=bob["password"]), metadata=auth(bob), timeout=10)
    deleted_at = time.monotonic()
    # The token is still valid (it expires on its own): bob's client keeps writing until tasks refuses.
    created, refused_after = [], None
    while time.monotonic() - deleted_at < 20:
        try:
            created.append(("task", c.tasks.CreateMarketTask(mp.CreateMarketTaskRequest(idempotency_key=uuid.uuid4().hex, title="After"),
                                                              metadata=auth(bob), timeout=10).task.task_id))
            created.append(("habit", c.tasks.CreateHabit(hp.CreateHabitRequest(idempotency_key=uuid.uuid4().hex, title="After", days=[1, 2, 3]),
                                                          metadata=auth(bob), timeout=10).habit.habit_id))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "no longer exists" in e.details(), e
            refused_after = time.monotonic() - deleted_at
            break
        time.sleep(0.05)
    print(f"\ndeleted account: tasks took {len(created)} writes, refused its token {refused_after} s after DeleteAccount returned")
    assert refused_after is not None
    # Every later call is refused too, reads included.
    for call in (lambda: c.tasks.ListMyHabits(hp.ListMyHabitsRequest(), metadata=auth(bob), timeout=10),
                 lambda: c.tasks.ListMarketTasks(mp.ListMarketTasksRequest(scope=mp.MARKET_TASK_SCOPE_ALL), metadata=auth(bob), timeout=10)):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Nothing bob wrote, before or after the deletion, is left: the erasure removed what came first.
    open_tasks = c.tasks.ListMarketTasks(mp.ListMarketTasksRequest(scope=mp.MARKET_TASK_SCOPE_ALL, page_size=100), metadata=auth(alice),
                                         timeout=10).tasks
    assert [t.task_id for t in open_tasks if t.task_id == before.task_id or t.title == "After"] == []
    for kind, ident in created:
        if kind == "task":
            with pytest.raises(grpc.RpcError) as e:
                c.tasks.GetMarketTask(mp.GetMarketTaskRequest(task_id=ident), metadata=auth(alice), timeout=10)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
