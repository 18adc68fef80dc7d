"""The tasks part-2 bench rows (run by scripts/bench.d/tasks.sh, or alone):

  python tasks_search.py BIN_DIR WORK_DIR STUBS_DIR [--tasks N] [--events N] [--queries N] [--bids N]

- SearchMarketTasks with N open tasks spread over Canada (70 % around ten cities, 30 % anywhere in
  the country), keywords (1–2 words) within 5 km of a city: p50 and p99 latency, one call in flight,
  against a second tasks-service on a copy of the same database that answers by a full scan
  (TASKS_SEARCH_INDEXES=0), in the same run; every answer of the two is compared (same tasks, same
  order).
- ListHabitHistory within 5 km of a city over one user's N habit events spread the same way.
- PlaceBid writes per second, 4 in flight (grpcio), each on its own open task.

The tasks and events are written straight into the service's database (SQLite, the service's own
triggers keeping FTS5 and the R*Tree) while the service is stopped: the rows are what the service
would have written, without 100,000 gRPC calls of setup. Output: one `key=value` line per figure.
"""
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import unicodedata
import uuid

ARGS = sys.argv[1:]
BIN, WORK, STUBS = ARGS[0], ARGS[1], ARGS[2]


def opt(name, default):
    return int(ARGS[ARGS.index(name) + 1]) if name in ARGS else default


N_TASKS, N_EVENTS, N_QUERIES, N_BIDS = opt("--tasks", 100_000), opt("--events", 100_000), opt("--queries", 300), opt("--bids", 2000)
sys.path.insert(0, STUBS)
import grpc  # noqa: E402
from accounts.v1 import accounts_pb2 as apb, accounts_pb2_grpc as arpc  # noqa: E402
from common.v1 import types_pb2 as types  # noqa: E402
from tasks.v1 import habits_pb2 as hp, marketplace_pb2 as mp, tasks_pb2_grpc as trpc  # noqa: E402

CITIES = [("Toronto", 43.6532, -79.3832), ("Montreal", 45.5019, -73.5674), ("Vancouver", 49.2827, -123.1207),
          ("Calgary", 51.0447, -114.0719), ("Edmonton", 53.5461, -113.4938), ("Ottawa", 45.4215, -75.6972),
          ("Winnipeg", 49.8951, -97.1384), ("Quebec City", 46.8139, -71.2080), ("Halifax", 44.6488, -63.5752),
          ("Saskatoon", 52.1332, -106.6700)]
WORDS = ("desk chair table shelf bed sofa wardrobe dresser lamp mirror assemble install mount repair fix paint clean move carry deliver "
         "pick up drop garden lawn mow rake leaves snow shovel gutter fence deck patio window door lock tap sink toilet shower tile "
         "floor carpet wall ceiling fan light bulb switch outlet wire cable tv router computer laptop printer phone dog cat walk feed "
         "sit plants water groceries shopping cook meal bake cake party event music guitar piano lesson tutor math english french "
         "essay resume photo video edit design logo website garage attic basement boxes storage bike car tire oil wash wax "
         "ikea malm billy kallax pax hemnes bookcase crib stroller toys laundry iron fold dishes fridge oven stove microwave").split()
ENV = dict(os.environ, SERVICE_TOKEN="bench-service-credential-0123456789abcdef", GATEWAY_TOKEN="bench-gateway-credential-0123456789abcdef",
           LOG_LEVEL="warning", ACCOUNTS_SCRYPT_N="1024", ACCOUNTS_SIGNUPS_PER_ADDRESS="1000000")
PROCS = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, exe, data, port, env):
    log = open(os.path.join(WORK, f"{name}.log"), "w")
    p = subprocess.Popen([os.path.join(BIN, exe), "--host", "127.0.0.1", "--port", str(port), "--data-dir", data], env=env, stdout=log,
                         stderr=log)
    PROCS.append(p)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            if p.poll() is not None:
                raise SystemExit(f"{name} exited: see {log.name}")
            time.sleep(0.05)
    raise SystemExit(f"{name} did not start")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(30)


def place(rng):
    if rng.random() < 0.7:
        _, lat, lon = rng.choice(CITIES)
        return lat + rng.gauss(0, 0.27), lon + rng.gauss(0, 0.27 / math.cos(math.radians(lat)))  # σ ≈ 30 km
    return rng.uniform(43, 60), rng.uniform(-130, -60)


def ulid(ms, rng):
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    t = "".join(alphabet[(ms >> (5 * i)) & 31] for i in reversed(range(10)))
    return t + "".join(rng.choice(alphabet) for _ in range(16))


def fold(text):
    """TextFold.fold (Sources/ServiceKit/TextFold.swift): NFKC, full case folding, NFKC. The
    service matches words against these stored copies, so rows seeded here carry them too."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    os.makedirs(WORK, exist_ok=True)
    rng = random.Random(15)
    acc_port, soc_port, fin_port = free_port(), free_port(), free_port()
    env = dict(ENV, ACCOUNTS_ADDR=f"127.0.0.1:{acc_port}", SOCIAL_ADDR=f"127.0.0.1:{soc_port}", FINANCE_ADDR=f"127.0.0.1:{fin_port}")
    start("s-accounts", "accounts-service", os.path.join(WORK, "s-accounts"), acc_port, env)
    accounts = arpc.AccountsStub(grpc.insecure_channel(f"127.0.0.1:{acc_port}"))

    def user(name):
        s = accounts.SignUp(apb.SignUpRequest(username=name, email=f"{name}@example.com", password="correct horse battery staple"), timeout=30)
        return s.user.user_id, [("authorization", f"Bearer {s.session.access_token}")]
    alice_id, alice = user("searchalice")
    bob_id, bob = user("searchbob")

    # The schema: one start of the service; then the rows, straight into its database.
    a_dir, b_dir = os.path.join(WORK, "s-tasks-index"), os.path.join(WORK, "s-tasks-scan")
    port_a = free_port()
    stop(start("s-tasks-index", "tasks-service", a_dir, port_a, env))
    db = sqlite3.connect(os.path.join(a_dir, "tasks.sqlite"))
    now = int(time.time() * 1000)
    t0 = time.perf_counter()
    with db:
        db.execute("INSERT OR REPLACE INTO users (user_id, username, display_name, refreshed_at) VALUES (?, 'searchalice', '', ?)",
                   (alice_id, now))
        db.execute("INSERT OR REPLACE INTO users (user_id, username, display_name, refreshed_at) VALUES (?, 'searchbob', '', ?)", (bob_id, now))
        rows = []
        for i in range(N_TASKS):
            lat, lon = place(rng)
            at = now - (N_TASKS - i) * 1000
            title, description = " ".join(rng.sample(WORDS, 3)).capitalize()[:30], " ".join(rng.sample(WORDS, 8))
            rows.append((ulid(at, rng), alice_id, title, description, fold(title), fold(description), lat, lon, at, at))
        db.executemany("INSERT INTO market_tasks (id, requester_id, title, description, title_folded, description_folded, latitude, longitude, "
                       "status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)", rows)
        habits = max(1, N_EVENTS // 365 + 1)
        today = (now // 86_400_000)
        for h in range(habits):
            hid = ulid(now - h, rng)
            db.execute("INSERT INTO habits (id, owner_id, title, title_key, reason, weekdays, start_day, created_at, updated_at) "
                       "VALUES (?, ?, ?, ?, '', 127, 20000101, ?, ?)", (hid, bob_id, f"Habit {h}", f"habit {h}", now, now))
            evs = []
            for d in range(min(365, N_EVENTS - h * 365)):
                day = time.gmtime((today - d) * 86400)
                key = day.tm_year * 10000 + day.tm_mon * 100 + day.tm_mday
                lat, lon = place(rng)
                at = (today - d) * 86_400_000 + 3_600_000
                comment = rng.choice(WORDS)
                evs.append((ulid(at, rng), hid, bob_id, key, comment, fold(comment), lat, lon, at, at))
            db.executemany("INSERT INTO habit_events (id, habit_id, owner_id, day, comment, comment_folded, latitude, longitude, utc_offset, "
                           "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)", evs)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    print(f"seed_seconds={time.perf_counter() - t0:.1f}", flush=True)
    shutil.copytree(a_dir, b_dir)
    port_b = free_port()
    start("s-tasks-index", "tasks-service", a_dir, port_a, env)
    start("s-tasks-scan", "tasks-service", b_dir, port_b, dict(env, TASKS_SEARCH_INDEXES="0"))
    opts = [("grpc.max_receive_message_length", 8 << 20)]
    ta = trpc.TasksStub(grpc.insecure_channel(f"127.0.0.1:{port_a}", options=opts))
    tb = trpc.TasksStub(grpc.insecure_channel(f"127.0.0.1:{port_b}", options=opts))

    # Search: the same queries to both; answers compared.
    queries = []
    for _ in range(N_QUERIES):
        _, lat, lon = rng.choice(CITIES)
        queries.append(mp.SearchMarketTasksRequest(keywords=" ".join(rng.sample(WORDS, rng.choice((1, 1, 2)))),
                                                   near=types.GeoPoint(latitude=lat + rng.gauss(0, 0.05), longitude=lon + rng.gauss(0, 0.05)),
                                                   max_distance_km={"value": 5.0}, page_size=20))
    # Warm up both (a running service has its working set in memory): the index server with every
    # query once (its pages are the candidates'), the scan server with a few (a scan reads them all).
    for q in queries:
        ta.SearchMarketTasks(q, metadata=bob, timeout=60)
    for q in queries[:10]:
        tb.SearchMarketTasks(q, metadata=bob, timeout=120)
    # Each server answers all queries in turn (no interleaving: one's work does not disturb the
    # other's caches); then the answers are compared.
    lat_a, lat_b, ans_a, ans_b = [], [], [], []
    for stub, lats, answers, deadline in ((ta, lat_a, ans_a, 60), (tb, lat_b, ans_b, 120)):
        for q in queries:
            t = time.perf_counter()
            r = stub.SearchMarketTasks(q, metadata=bob, timeout=deadline)
            lats.append(time.perf_counter() - t)
            answers.append([x.task.task_id for x in r.results])
    found = sum(len(a) for a in ans_a)
    mismatches = sum(1 for a, b in zip(ans_a, ans_b) if a != b)
    print(f"search_tasks={N_TASKS} search_queries={len(queries)} search_mean_results={found / len(queries):.1f} mismatches={mismatches}")
    print(f"search_index_p50_ms={1000 * pct(lat_a, 50):.2f} search_index_p99_ms={1000 * pct(lat_a, 99):.2f}")
    print(f"search_scan_p50_ms={1000 * pct(lat_b, 50):.2f} search_scan_p99_ms={1000 * pct(lat_b, 99):.2f}")
    print(f"search_speedup_p50={pct(lat_b, 50) / pct(lat_a, 50):.1f} search_speedup_p99={pct(lat_b, 99) / pct(lat_a, 99):.1f}", flush=True)

    # Habit history within 5 km of a city.
    hist, seen = [], 0
    for _ in range(N_QUERIES):
        _, lat, lon = rng.choice(CITIES)
        q = hp.ListHabitHistoryRequest(scope=hp.HABIT_HISTORY_SCOPE_MINE, page_size=50,
                                       near=hp.HabitHistoryNear(center=types.GeoPoint(latitude=lat, longitude=lon), radius_km=5))
        t = time.perf_counter()
        r = ta.ListHabitHistory(q, metadata=bob, timeout=60)
        hist.append(time.perf_counter() - t)
        seen += len(r.events)
    print(f"history_events={N_EVENTS} history_mean_results={seen / N_QUERIES:.1f} history_p50_ms={1000 * pct(hist, 50):.2f} "
          f"history_p99_ms={1000 * pct(hist, 99):.2f}", flush=True)

    # PlaceBid: 4 in flight, each on its own open task.
    open_ids, tok = [], ""
    while len(open_ids) < N_BIDS:
        page = ta.ListMarketTasks(mp.ListMarketTasksRequest(scope=mp.MARKET_TASK_SCOPE_ALL, page_size=100, page_token=tok), metadata=bob,
                                  timeout=60)
        open_ids += [t.task_id for t in page.tasks]
        tok = page.next_page_token
        if not tok:
            break
    open_ids = open_ids[:N_BIDS]
    lock, nxt, lats = threading.Lock(), [0], []

    def bidder():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(open_ids):
                return
            t = time.perf_counter()
            r = ta.PlaceBid(mp.PlaceBidRequest(idempotency_key=uuid.uuid4().hex, task_id=open_ids[i],
                                               amount=types.Money(amount_cents=1000 + i, currency="CAD")), metadata=bob, timeout=60)
            assert r.task_status == mp.MARKET_TASK_STATUS_BIDDED
            with lock:
                lats.append(time.perf_counter() - t)
    ths = [threading.Thread(target=bidder) for _ in range(4)]
    t0 = time.perf_counter()
    [t.start() for t in ths]
    [t.join() for t in ths]
    secs = time.perf_counter() - t0
    print(f"bids={len(open_ids)} bids_per_second={len(open_ids) / secs:.1f} bid_mean_ms={1000 * sum(lats) / len(lats):.2f}", flush=True)


try:
    main()
finally:
    for p in reversed(PROCS):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
