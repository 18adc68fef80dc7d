# scripts/bench hook (sourced): tasks-service, with accounts-service, the gateway and social.
#  - "my tasks" (ListMyTeamTasks, a page of 10 of a user's 40 team tasks with participants) and
#    "list chores" (ListChores, a page of 20 of a household's 40 chores) through h2load on
#    tasks-service, both shapes, the requests built by `protoc --encode`;
#  - FinishChore writes per second, 4 in flight (grpcio), each a durable transaction (rotation,
#    due date, revision, notification queued in the outbox);
#  - attachment uploads of 1 MiB files through the gateway (grpcio, UploadTeamTaskAttachment, 4 in
#    flight): MB/s; and the gateway's resident memory (VmRSS) idle and at its peak while 20 uploads
#    run at once (sampled every 10 ms).
#  - part 2 (scripts/bench.d/tasks_search.py, its own accounts-service and two tasks-services):
#    SearchMarketTasks at 100,000 open tasks spread over Canada, keywords within 5 km of a city,
#    p50/p99, against a full scan of a copy of the same database (TASKS_SEARCH_INDEXES=0) in the
#    same run, every answer compared; ListHabitHistory within 5 km at 100,000 events; PlaceBid
#    writes per second (4 in flight).
# social is the real social-service (memberships, teams, notifications).
if [ $BUILD = 1 ]; then
  for p in tasks-service gateway accounts-service social-service; do
    echo "bench: scripts/swift-release --product $p" >&2
    "$ROOT"/scripts/swift-release --product $p >&2
  done
fi
REL=$ROOT/.build/release
if [ ! -x "$REL/tasks-service" ] || [ ! -x "$REL/gateway" ] || [ ! -x "$REL/accounts-service" ] || [ ! -x "$REL/social-service" ]; then
  echo "bench: tasks rows skipped (release tasks-service, gateway, accounts-service or social-service missing)" >&2
else
  T_ACC=$(free_port) T_SOC=$(free_port) T_TASKS=$(free_port) T_GW=$(free_port)
  mkdir -p "$WORK/tasks-py" "$WORK/t-accounts" "$WORK/t-social" "$WORK/t-tasks"
  "$PY" -m grpc_tools.protoc -IProto -I/usr/include --python_out="$WORK/tasks-py" --grpc_python_out="$WORK/tasks-py" \
    $(cd Proto && find . -name '*.proto' | sed 's|^\./||')
  T_ENV=(env SERVICE_TOKEN=$BENCH_SERVICE_TOKEN GATEWAY_TOKEN=$BENCH_GATEWAY_TOKEN LOG_LEVEL=warning ACCOUNTS_SCRYPT_N=1024
    ACCOUNTS_SIGNUPS_PER_ADDRESS=1000000 ACCOUNTS_ADDR=127.0.0.1:$T_ACC SOCIAL_ADDR=127.0.0.1:$T_SOC TASKS_ADDR=127.0.0.1:$T_TASKS
    GATEWAY_UPSTREAMS=accounts,social,tasks GATEWAY_ADDRESS_RATE=0 GATEWAY_USER_RATE=0)
  start_bg t-accounts "${T_ENV[@]}" "$REL/accounts-service" --host 127.0.0.1 --port "$T_ACC" --data-dir "$WORK/t-accounts"
  start_bg t-social "${T_ENV[@]}" "$REL/social-service" --host 127.0.0.1 --port "$T_SOC" --data-dir "$WORK/t-social"
  start_bg t-tasks "${T_ENV[@]}" "$REL/tasks-service" --host 127.0.0.1 --port "$T_TASKS" --data-dir "$WORK/t-tasks"
  T_TASKS_PID=$BG_PID
  start_bg t-gateway "${T_ENV[@]}" "$REL/gateway" --host 127.0.0.1 --port "$T_GW"
  T_GW_PID=$BG_PID
  for p in "$T_ACC" "$T_SOC" "$T_TASKS" "$T_GW"; do wait_port "$p" 60 || { tail -20 "$WORK"/t-*.log >&2; exit 1; }; done

  T_N=400; T_UPLOADS=60; [ $QUICK = 1 ] && T_N=100 && T_UPLOADS=20
  T_RESULT=$(SERVICE_TOKEN=$BENCH_SERVICE_TOKEN PYTHONPATH="$WORK/tasks-py" "$PY" - "$T_ACC" "$T_TASKS" "$T_GW" "$T_N" "$T_UPLOADS" "$T_GW_PID" <<'PYEOF'
import datetime, os, sys, threading, time, uuid
import grpc
from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc as arpc
from social.v1 import social_pb2 as spb, social_pb2_grpc as srpc
from tasks.v1 import tasks_pb2_grpc as trpc, team_tasks_pb2 as tt, chores_pb2 as cp
from common.v1 import types_pb2 as types
acc_port, tasks_port, gw_port, n, uploads, gw_pid = sys.argv[1:7]
n, uploads, gw_pid = int(n), int(uploads), int(gw_pid)
opts = [("grpc.max_receive_message_length", 8 << 20), ("grpc.max_send_message_length", 8 << 20)]
accounts = arpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{acc_port}"))
tasks = trpc.TasksStub(grpc.insecure_channel(f"127.0.0.1:{tasks_port}", options=opts))
gw = grpc.insecure_channel(f"127.0.0.1:{gw_port}", options=opts)
pw = "correct horse battery staple"
def user(name):
    s = accounts.SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password=pw), timeout=30)
    return s.user.user_id, [("authorization", f"Bearer {s.session.access_token}")]
a_id, a = user("benchalice"); b_id, b = user("benchbob"); c_id, c = user("benchcarol")
for i in range(40):
    tasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name=f"Bench task {i}",
        description="A team task of the bench", participant_usernames=["benchbob", "benchcarol"]), metadata=a, timeout=30)
# A household, created in social; everyone joins through the codes accounts mailed.
s = srpc.SocialStub(gw)
hh = s.CreateHousehold(spb.CreateHouseholdRequest(name="Bench house"), metadata=a, timeout=30).household.household_id
mail = arpc.AccountsInternalStub(grpc.insecure_channel(f"127.0.0.1:{acc_port}"))
for name, md in (("benchbob", b), ("benchcarol", c)):
    s.InviteHousemate(spb.InviteHousemateRequest(household_id=hh, email=f"{name}@example.com"), metadata=a, timeout=30)
    svc = [("x-service-token", os.environ["SERVICE_TOKEN"])]
    for _ in range(200):
        m = mail.ListSentMail(apb.ListSentMailRequest(to_email=f"{name}@example.com", kind=apb.MAIL_KIND_HOUSEHOLD_INVITE), metadata=svc, timeout=10).mails
        if m: break
        time.sleep(0.05)
    s.JoinHousehold(spb.JoinHouseholdRequest(invite_code=m[0].data["invite_code"]), metadata=md, timeout=30)
today = datetime.datetime.now(datetime.timezone.utc).date()
due = types.Date(year=today.year, month=today.month, day=today.day)
chores = []
for i in range(max(40, n)):
    ch = tasks.CreateChore(cp.CreateChoreRequest(idempotency_key=uuid.uuid4().hex, household_id=hh, name=f"Chore {i:04d}", due_date=due,
        assignee_user_ids=[a_id, b_id, c_id], recurrence=cp.ChoreRecurrence(every_n_days=cp.ChoreEveryNDays(days=1 + i % 7)), time_zone="UTC"),
        metadata=a, timeout=30).chore
    chores.append([ch.chore_id, ch.revision])
# Checked reads first (h2load counts any HTTP 200 as success).
assert len(tasks.ListMyTeamTasks(tt.ListMyTeamTasksRequest(page_size=10), metadata=b, timeout=10).tasks) == 10
assert len(tasks.ListChores(cp.ListChoresRequest(household_id=hh, page_size=20), metadata=b, timeout=10).chores) == 20

# FinishChore: n finishes, 4 in flight, each on its own chore with its revision.
lock, nxt = threading.Lock(), [0]
lat = []
def finisher():
    while True:
        with lock:
            i = nxt[0]; nxt[0] += 1
        if i >= n: return
        chore = chores[i % len(chores)]
        t = time.perf_counter()
        r = tasks.FinishChore(cp.FinishChoreRequest(chore_id=chore[0], expected_revision=chore[1]), metadata=a, timeout=30).chore
        chore[1] = r.revision
        with lock: lat.append(time.perf_counter() - t)
ths = [threading.Thread(target=finisher) for _ in range(4)]
t0 = time.perf_counter(); [t.start() for t in ths]; [t.join() for t in ths]
finish_rate, finish_ms = n / (time.perf_counter() - t0), 1000 * sum(lat) / len(lat)

# Uploads of distinct 1 MiB files through the gateway: tokens for enough tasks (20 attachments each).
gtasks = trpc.TasksStub(gw)
def tokens(count):
    out = []
    for _ in range(count):
        t = gtasks.CreateTeamTask(tt.CreateTeamTaskRequest(idempotency_key=uuid.uuid4().hex, name="Upload bench"), metadata=a, timeout=30).task
        out.append(gtasks.CreateTeamTaskUploadToken(tt.CreateTeamTaskUploadTokenRequest(task_id=t.task_id), metadata=a, timeout=30).upload_token)
    return out
def run_uploads(count, in_flight):
    toks = tokens((count + 19) // 20)
    files = [b"%PDF-" + os.urandom(1024 * 1024 - 5) for _ in range(min(count, 8))]
    nxt = [0]
    def up():
        while True:
            with lock:
                i = nxt[0]; nxt[0] += 1
            if i >= count: return
            data = files[i % len(files)][:-8] + i.to_bytes(8, "big")
            r = gtasks.UploadTeamTaskAttachment(tt.UploadTeamTaskAttachmentRequest(upload_token=toks[i // 20], filename=f"f{i}.pdf",
                content_type="application/pdf", data=data), timeout=60)
            assert r.attachment.size_bytes == len(data)
    ths = [threading.Thread(target=up) for _ in range(in_flight)]
    t0 = time.perf_counter(); [t.start() for t in ths]; [t.join() for t in ths]
    return time.perf_counter() - t0
def rss():
    with open(f"/proc/{gw_pid}/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS:")).split()[1])
idle = rss()
secs = run_uploads(uploads, 4)
mbps = uploads * 1024 * 1024 / secs / 1e6
peak, stop = [0], threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss()); time.sleep(0.01)
sampler = threading.Thread(target=sample); sampler.start()
run_uploads(40, 20)
stop.set(); sampler.join()
token = a[0][1].split(" ", 1)[1]
print(f"{finish_rate:.1f}|{finish_ms:.1f}|{mbps:.1f}|{idle}|{peak[0]}|{hh}|{token}|{b[0][1].split(' ', 1)[1]}")
PYEOF
  ) || { echo "bench: tasks setup/loops failed" >&2; tail -20 "$WORK"/t-*.log >&2; exit 1; }
  IFS='|' read -r T_FINISH T_FINISH_MS T_MBPS T_GW_IDLE T_GW_PEAK T_HH T_TOKEN_A T_TOKEN_B <<<"$T_RESULT"
  ROWS+=("tasks FinishChore|4 in flight|$T_FINISH|$(awk -v m="$T_FINISH_MS" 'BEGIN{printf "%.0f", m*1000}')")
  echo "bench: tasks FinishChore $T_FINISH/s (mean $T_FINISH_MS ms, 4 in flight)" >&2
  echo "bench: tasks uploads of 1 MiB through the gateway: $T_MBPS MB/s (4 in flight)" >&2
  RSS_ROWS+=("gateway idle (tasks rows)|$T_GW_IDLE")
  RSS_ROWS+=("gateway peak, 20 uploads of 1 MiB at once|$T_GW_PEAK")
  ROWS+=("gateway UploadTeamTaskAttachment 1 MiB → MB/s|4 in flight|$T_MBPS|0")

  MY_BODY=$WORK/listmyteamtasks.bin
  grpc_body "$MY_BODY" tasks.v1.ListMyTeamTasksRequest 'page_size: 10' tasks/v1/tasks.proto -IProto -I/usr/include
  CH_BODY=$WORK/listchores.bin
  grpc_body "$CH_BODY" tasks.v1.ListChoresRequest "household_id: \"$T_HH\" page_size: 20" tasks/v1/tasks.proto -IProto -I/usr/include
  for shape in throughput latency; do
    MIN_DATA_PER_REQUEST=2000 h2load_row "tasks ListMyTeamTasks" $shape "http://127.0.0.1:$T_TASKS/tasks.v1.Tasks/ListMyTeamTasks" "$MY_BODY" \
      "${GRPC_HEADERS[@]}" -H "authorization: Bearer $T_TOKEN_B"
    MIN_DATA_PER_REQUEST=4000 h2load_row "tasks ListChores" $shape "http://127.0.0.1:$T_TASKS/tasks.v1.Tasks/ListChores" "$CH_BODY" \
      "${GRPC_HEADERS[@]}" -H "authorization: Bearer $T_TOKEN_B"
  done
  rss_row "tasks-service after load" "$T_TASKS_PID"
  kill -0 "$T_TASKS_PID" || { echo "bench: tasks-service died" >&2; tail -20 "$WORK/t-tasks.log" >&2; exit 1; }

  # Part 2: search with indexes vs a full scan, habit history within 5 km, PlaceBid writes/s.
  T2_ARGS=(--tasks 100000 --events 100000 --queries 300 --bids 2000)
  [ $QUICK = 1 ] && T2_ARGS=(--tasks 100000 --events 100000 --queries 100 --bids 500)
  T2_OUT=$("$PY" scripts/bench.d/tasks_search.py "$REL" "$WORK/tasks2" "$WORK/tasks-py" "${T2_ARGS[@]}") \
    || { echo "bench: tasks part-2 rows failed" >&2; tail -20 "$WORK"/tasks2/*.log >&2; exit 1; }
  echo "$T2_OUT" >&2
  declare -A T2=()
  for kv in $T2_OUT; do T2[${kv%%=*}]=${kv#*=}; done
  [ "${T2[mismatches]}" = 0 ] || { echo "bench: indexed search and full scan disagree on ${T2[mismatches]} queries" >&2; exit 1; }
  EXTRA_LINES+=("$(printf '%-46s %10s %10s %12s' "tasks search, ${T2[search_tasks]} open tasks, 5 km + words" "p50 ms" "p99 ms" "results/query")")
  EXTRA_LINES+=("$(printf '%-46s %10s %10s %12s' "  FTS5 + R*Tree + exact distance" "${T2[search_index_p50_ms]}" "${T2[search_index_p99_ms]}" "${T2[search_mean_results]}")")
  EXTRA_LINES+=("$(printf '%-46s %10s %10s %12s' "  full scan (same data, same run)" "${T2[search_scan_p50_ms]}" "${T2[search_scan_p99_ms]}" "${T2[search_mean_results]}")")
  EXTRA_LINES+=("$(printf '%-46s %10s %10s' "  speed-up (scan / index)" "${T2[search_speedup_p50]}x" "${T2[search_speedup_p99]}x")")
  EXTRA_LINES+=("$(printf '%-46s %10s %10s %12s' "tasks habit history, ${T2[history_events]} events, 5 km" "${T2[history_p50_ms]}" "${T2[history_p99_ms]}" "${T2[history_mean_results]}")")
  ROWS+=("tasks PlaceBid|4 in flight|${T2[bids_per_second]}|$(awk -v m="${T2[bid_mean_ms]}" 'BEGIN{printf "%.0f", m*1000}')")
fi
