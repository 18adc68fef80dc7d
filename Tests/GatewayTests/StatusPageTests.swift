import Foundation
import Logging
import Observability
import RPCCore
import RPCServices
import RPCTransport
import ServiceKitTesting
import Synchronization
import Testing

@testable import Gateway

/// The status page (`GET /status`, `/status.json`): totals from an exposition, rates from two
/// scrapes and the error rule, escaping, the small HTTP/1.1 client, a down or silent upstream,
/// and the page served by a real gateway.
@Suite struct StatusPageTests {
    /// An exposition as a service writes it: calls by service and code, one latency histogram.
    static func exposition(
        calls: [(service: String, code: String, count: Double)], sum: Double = 0, count: Double = 0,
        buckets: [(String, Double)] = [], health: Double = 0, extra: String = ""
    ) -> PrometheusExposition {
        var t = "# TYPE grpc_server_handled_total counter\n"
        for c in calls {
            t += "grpc_server_handled_total{grpc_service=\"\(c.service)\",grpc_method=\"M\",grpc_code=\"\(c.code)\"} \(c.count)\n"
        }
        t += "grpc_server_handled_total{grpc_service=\"grpc.health.v1.Health\",grpc_method=\"Check\",grpc_code=\"OK\"} \(health)\n"
        t += "# TYPE grpc_server_handling_seconds histogram\n"
        for (le, n) in buckets { t += "grpc_server_handling_seconds_bucket{grpc_service=\"s\",grpc_method=\"M\",le=\"\(le)\"} \(n)\n" }
        t += "grpc_server_handling_seconds_bucket{grpc_service=\"grpc.health.v1.Health\",grpc_method=\"Check\",le=\"+Inf\"} \(health)\n"
        t += "grpc_server_handling_seconds_sum{grpc_service=\"s\",grpc_method=\"M\"} \(sum)\n"
        t += "grpc_server_handling_seconds_count{grpc_service=\"s\",grpc_method=\"M\"} \(count)\n"
        t += "grpc_server_handling_seconds_sum{grpc_service=\"grpc.health.v1.Health\",grpc_method=\"Check\"} \(health)\n"
        t += "grpc_server_handling_seconds_count{grpc_service=\"grpc.health.v1.Health\",grpc_method=\"Check\"} \(health)\n"
        t += "# TYPE grpc_server_calls_in_flight gauge\ngrpc_server_calls_in_flight 3\ngrpc_server_connections 5\n"
        return PrometheusExposition(parsing: t + extra)
    }

    // MARK: Totals and rates

    @Test func ratesFromTwoScrapesFollowTheErrorRule() throws {
        let before = ProcessTotals(
            Self.exposition(
                calls: [("a.v1.A", "OK", 100), ("a.v1.A", "NOT_FOUND", 10)], sum: 1, count: 110,
                buckets: [("0.001", 100), ("0.01", 110), ("+Inf", 110)], health: 50))
        let after = ProcessTotals(
            Self.exposition(
                calls: [
                    ("a.v1.A", "OK", 160), ("a.v1.A", "NOT_FOUND", 20), ("b.v1.B", "CANCELLED", 5), ("b.v1.B", "UNAVAILABLE", 10),
                    ("unknown", "UNIMPLEMENTED", 5),
                ], sum: 2, count: 200, buckets: [("0.001", 150), ("0.01", 200), ("+Inf", 200)], health: 9000))
        #expect(after.callsInFlight == 3 && after.connections == 5)
        #expect(after.calls["OK"] == 160, "health checks are not traffic")
        let r = try #require(ProcessRates(from: before, to: after, seconds: 10))
        // 90 calls in 10 s: 60 OK, 10 NOT_FOUND, 5 CANCELLED, 10 UNAVAILABLE, 5 UNIMPLEMENTED.
        #expect(r.requestsPerSecond == 9)
        #expect(r.errorsPerSecond == 2.5, "every code but OK and CANCELLED")
        #expect(r.serverErrorsPerSecond == 1, "UNAVAILABLE only: the others are the clients'")
        #expect(r.errorRatio == 25.0 / 90)
        #expect(r.serverErrorRatio == 10.0 / 90)
        #expect(r.codes.map(\.code) == ["NOT_FOUND", "UNAVAILABLE", "CANCELLED", "UNIMPLEMENTED"])
        #expect(r.codes.first?.perSecond == 1)
        #expect(abs((r.meanLatency ?? 0) - 1.0 / 90) < 1e-12)
        // 90 calls: 50 under 1 ms, 40 more under 10 ms. p95 = rank 85.5 → in (1 ms, 10 ms]:
        // 1 ms + 9 ms × (85.5 − 50) / 40.
        #expect(abs((r.p95Latency ?? 0) - (0.001 + 0.009 * 35.5 / 40)) < 1e-12)
    }

    @Test func aRestartedProcessCountsFromZero() throws {
        let before = ProcessTotals(Self.exposition(calls: [("a", "OK", 1000), ("a", "INTERNAL", 10)], sum: 10, count: 1010))
        let after = ProcessTotals(Self.exposition(calls: [("a", "OK", 30), ("a", "INTERNAL", 10)], sum: 0.4, count: 40))
        let r = try #require(ProcessRates(from: before, to: after, seconds: 10))
        #expect(r.requestsPerSecond == 4)
        #expect(r.serverErrorsPerSecond == 1)
        #expect(r.meanLatency == 0.01)
        let idle = try #require(ProcessRates(from: after, to: after, seconds: 10))
        #expect(idle.requestsPerSecond == 0 && idle.errorRatio == nil && idle.meanLatency == nil && idle.p95Latency == nil)
        #expect(ProcessRates(from: after, to: after, seconds: 0) == nil)
    }

    @Test func quantileAsPrometheusEstimatesIt() {
        let b: [(le: Double, count: Double)] = [(0.1, 10), (0.2, 20), (.infinity, 20)]
        #expect(ProcessRates.quantile(0.5, buckets: b) == 0.1)
        #expect(abs(ProcessRates.quantile(0.75, buckets: b)! - 0.15) < 1e-12)
        #expect(ProcessRates.quantile(0.95, buckets: [(0.1, 1), (.infinity, 100)]) == 0.1, "in +Inf: the highest finite bound")
        #expect(ProcessRates.quantile(0.95, buckets: [(0.1, 0), (.infinity, 0)]) == nil)
        #expect(ProcessRates.quantile(0.95, buckets: []) == nil)
    }

    @Test func outboxShowsWhateverGaugesExist() {
        let none = ProcessTotals(Self.exposition(calls: []))
        #expect(none.outbox == nil)
        #expect(StatusPage.outboxSummary(none.outbox) == "—")
        let extra = """
            # TYPE outbox_backlog_events gauge
            outbox_backlog_events{database="tasks",destination="social"} 4
            outbox_backlog_events{database="tasks",destination="finance"} 0
            outbox_parked_events{database="tasks",destination="social"} 1
            outbox_oldest_event_age_seconds{database="tasks",destination="social"} 125
            outbox_deliveries_total{database="tasks",destination="social",result="delivered"} 99
            outbox_redeliveries_pending{destination="social"} 2
            """
        let t = ProcessTotals(Self.exposition(calls: [], extra: extra))
        let rows = try! #require(t.outbox)
        #expect(rows.map(\.destination) == ["finance", "social"])
        #expect(rows[1].values == ["backlog_events": 4, "parked_events": 1, "oldest_event_age_seconds": 125, "redeliveries_pending": 2])
        #expect(rows[0].values == ["backlog_events": 0], "a counter is not shown as a gauge")
        #expect(StatusPage.outboxSummary(rows) == "4 waiting · 1 parked · oldest 2 min")
        let table = StatusPage.outboxTable(rows)
        #expect(
            table.contains(
                "<th class=\"n\">Waiting</th><th class=\"n\">Parked</th><th class=\"n\">Oldest</th><th class=\"n\">redeliveries pending</th>"))
        #expect(table.contains("<tr><td>finance</td><td class=\"n\">0</td><td class=\"n\">—</td><td class=\"n\">—</td><td class=\"n\">—</td></tr>"))
        #expect(
            table.contains("<tr><td>social</td><td class=\"n\">4</td><td class=\"n\">1</td><td class=\"n\">2 min</td><td class=\"n\">2</td></tr>"))
    }

    @Test func formatsNumbersForPeople() {
        #expect(
            StatusPage.rate(0) == "0/s" && StatusPage.rate(0.05) == "0.05/s" && StatusPage.rate(12.34) == "12.3/s"
                && StatusPage.rate(1234) == "1234/s")
        #expect(StatusPage.percent(0) == "0%" && StatusPage.percent(0.0004) == "<0.1%" && StatusPage.percent(0.0123) == "1.2%")
        #expect(StatusPage.percent(0.5) == "50%")
        #expect(StatusPage.duration(0.000_25) == "250 µs" && StatusPage.duration(0.0042) == "4.2 ms" && StatusPage.duration(0.25) == "250 ms")
        #expect(StatusPage.duration(10) == "10 s" && StatusPage.duration(1.5) == "1.50 s")
        #expect(StatusPage.age(59) == "59 s" && StatusPage.age(3600) == "1.0 h" && StatusPage.age(200_000) == "2.3 d")
        let d = Date(timeIntervalSince1970: 1_767_225_599)  // 2025-12-31T23:59:59Z
        #expect(StatusPage.iso(d) == "2025-12-31T23:59:59Z" && StatusPage.clock(d) == "23:59:59 UTC")
        #expect(StatusPage.iso(Date(timeIntervalSince1970: 951_782_400)) == "2000-02-29T00:00:00Z")
    }

    // MARK: The board and the page

    /// A board over fake targets: `answers` says what each upstream's fetch does.
    static func board(
        _ answers: [String: @Sendable () async throws -> String], serving: Set<String>, required: Set<String>? = nil,
        interval: Duration? = .seconds(10)
    ) -> StatusBoard {
        var targets = [StatusBoard.Target(name: "gateway", source: .local { Array("grpc_server_connections 1\n".utf8) })]
        for name in answers.keys.sorted() {
            targets.append(.init(name: name, source: .http(host: name, port: 1), required: required?.contains(name) ?? true))
        }
        return StatusBoard(
            targets: targets, interval: interval, timeout: .milliseconds(300),
            serving: { $0 == "gateway" ? serving.isSuperset(of: required ?? Set(answers.keys)) : serving.contains($0) },
            fetch: { host, _, _ in Array(try await answers[host]!().utf8) })
    }

    @Test func escapesEverythingAScrapeBrings() async throws {
        let hostile = #"<script>alert("x")</script>"#
        let text = """
            grpc_server_handled_total{grpc_service="a",grpc_method="M",grpc_code="OK"} 1
            grpc_server_handled_total{grpc_service="a",grpc_method="M",grpc_code="\(hostile.replacingOccurrences(of: "\"", with: "\\\""))"} 1
            outbox_backlog_events{destination="\\"><img src=x onerror=alert(1)>"} 1
            """
        let calls = Mutex(0)
        let b = Self.board(
            [
                "accounts": {
                    let n = calls.withLock {
                        $0 += 1; return $0
                    }
                    return text.replacingOccurrences(of: "} 1\n", with: "} \(n)\n")
                }
            ], serving: ["accounts"])
        await b.scrapeOnce()
        await b.scrapeOnce()
        let html = StatusPage.html(b.report())
        #expect(!html.contains("<script") && !html.contains("<img"))
        #expect(html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"))
        #expect(html.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"))
        // The JSON has them as strings, escaped as JSON.
        let object = json(String(decoding: StatusPage.json(b.report()), as: UTF8.self))
        let accounts = try #require((object["processes"] as? [[String: Any]])?.first { $0["name"] as? String == "accounts" })
        #expect((accounts["codesPerSecond"] as? [String: Any])?.keys.contains(hostile) == true)
    }

    @Test func aDownUpstreamShowsDownAndTheRestStillShows() async throws {
        let counter = Mutex(0.0)
        let b = Self.board(
            [
                "accounts": {
                    let n = counter.withLock {
                        $0 += 10; return $0
                    }
                    return "grpc_server_handled_total{grpc_service=\"a\",grpc_method=\"M\",grpc_code=\"OK\"} \(n)\n"
                        + "grpc_server_handled_total{grpc_service=\"a\",grpc_method=\"M\",grpc_code=\"INVALID_ARGUMENT\"} \(n / 10)\n"
                },
                "social": { throw MetricsFetch.Failure.connect("refused") },
            ], serving: ["accounts"])
        var r = b.report()
        #expect(r.processes.map(\.name) == ["gateway", "accounts", "social"])
        #expect(r.processes.allSatisfy { $0.metrics == .pending })
        #expect(StatusPage.html(r).contains("not scraped yet"))
        await b.scrapeOnce()
        try await Task.sleep(for: .milliseconds(20))
        await b.scrapeOnce()
        r = b.report()
        let accounts = r.processes[1]
        let social = r.processes[2]
        #expect(accounts.serving && accounts.metrics == .ok && accounts.rates != nil)
        #expect(abs((accounts.rates?.errorRatio ?? 0) - 1.0 / 11) < 1e-9)
        #expect(!social.serving && social.metrics == .failing("cannot connect (refused)") && social.rates == nil && social.lastScrape == nil)
        #expect(r.requiredDown == ["social"])
        #expect(r.processes[0].connections == 1 && !r.processes[0].serving, "the gateway is not serving while a required upstream is down")
        let html = StatusPage.html(r)
        #expect(html.contains("<span class=\"status bad\">Not serving</span> Down: <a href=\"#svc-social\"><strong>social</strong></a>."))
        #expect(html.contains("id=\"svc-social\" data-service=\"social\" data-health=\"down\" data-metrics=\"failing\" data-rps=\"\""))
        #expect(html.contains("cannot connect (refused)</span>; never scraped"))
        #expect(html.contains("id=\"svc-accounts\" data-service=\"accounts\" data-health=\"up\" data-metrics=\"ok\""))
        #expect(!html.contains("127.0.0.1"), "no addresses on the page")
        let object = json(String(decoding: StatusPage.json(r), as: UTF8.self))
        #expect(object["serving"] as? Bool == false)
        #expect(object["requiredDown"] as? [String] == ["social"])
        let processes = try #require(object["processes"] as? [[String: Any]])
        #expect(processes[2]["health"] as? String == "down" && processes[2]["metricsProblem"] as? String == "cannot connect (refused)")
        #expect(processes[2]["requestsPerSecond"] is NSNull)
        #expect((processes[1]["requestsPerSecond"] as? Double ?? 0) > 0)
    }

    @Test func anOptionalUpstreamDownLeavesTheGatewayServing() async {
        let b = Self.board(["accounts": { "" }, "tasks": { throw MetricsFetch.Failure.timeout }], serving: ["accounts"], required: ["accounts"])
        await b.scrapeOnce()
        let r = b.report()
        #expect(r.requiredDown.isEmpty && r.processes[0].serving)
        let html = StatusPage.html(r)
        #expect(html.contains("tasks <span class=\"muted\">(optional)</span>"))
        #expect(html.contains("<span class=\"status ok\">Serving</span>"))
        #expect(html.contains("no answer in time"))
    }

    @Test func aSilentUpstreamDoesNotHoldThePage() async throws {
        // An upstream that accepts and never answers: the scrape ends at its timeout, and the
        // page answers meanwhile from what it has.
        let silent = try CannedServer(answer: nil)
        defer { silent.stop() }
        let b = StatusBoard(
            targets: [.init(name: "accounts", source: .http(host: "127.0.0.1", port: silent.port))], interval: .seconds(10),
            timeout: .milliseconds(300), serving: { _ in false },
            fetch: { host, port, timeout in try await MetricsFetch.get(host: host, port: port, timeout: timeout) })
        let started = ContinuousClock.now
        async let round: Void = b.scrapeOnce()
        try await Task.sleep(for: .milliseconds(50))
        let during = ContinuousClock.now
        #expect(b.report().processes[0].metrics == .pending)
        #expect(ContinuousClock.now - during < .milliseconds(50))
        await round
        let took = ContinuousClock.now - started
        #expect(took >= .milliseconds(250) && took < .seconds(2))
        #expect(b.report().processes[0].metrics == .failing("no answer in time"))
    }

    @Test func scrapingOffShowsHealthOnly() async {
        let b = Self.board(["accounts": { "" }], serving: ["accounts"], interval: nil)
        await b.run()  // returns at once
        let html = StatusPage.html(b.report())
        #expect(html.contains("metrics scraping is off") && html.contains("data-health=\"up\""))
    }

    // MARK: The HTTP client

    @Test func readsAnswersByLengthChunksOrClose() {
        func read(_ parts: [String], ended: Bool = false, maxBody: Int = 100) -> HTTPResponseReader.Outcome {
            var reader = HTTPResponseReader(maxBody: maxBody)
            var bytes: [UInt8] = []
            var outcome = HTTPResponseReader.Outcome.incomplete
            for (i, p) in parts.enumerated() {
                bytes += Array(p.utf8)
                outcome = reader.read(bytes, ended: ended && i == parts.count - 1)
            }
            return outcome
        }
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        #expect(read([ok + "Content-Length: 5\r\n\r\nab", "cde"]) == .complete(Array("abcde".utf8)))
        #expect(read([ok + "Content-Length: 5\r\n\r\nab"]) == .incomplete)
        #expect(read([ok + "Content-Length: 5\r\n\r\nab"], ended: true) == .failed(.closed))
        #expect(read([ok + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", "2;x=y\r\nde\r\n0\r\n\r\n"]) == .complete(Array("abcde".utf8)))
        #expect(read([ok + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"], ended: true) == .failed(.closed))
        #expect(read([ok + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n\r\n"]) == .failed(.malformed("bad chunk size")))
        #expect(read([ok + "\r\nuntil the end"], ended: true) == .complete(Array("until the end".utf8)))
        #expect(read([ok + "Content-Length: 101\r\n\r\n"]) == .failed(.tooLarge(100)), "refused from the header, before the body")
        #expect(read([ok + "\r\n" + String(repeating: "x", count: 101)]) == .failed(.tooLarge(100)))
        #expect(
            read([ok + "Transfer-Encoding: chunked\r\n\r\n65\r\n" + String(repeating: "x", count: 101) + "\r\n0\r\n\r\n"]) == .failed(.tooLarge(100)))
        #expect(read(["HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"]) == .failed(.status(404)))
        #expect(read(["SSH-2.0-OpenSSH\r\n\r\n"]) == .failed(.malformed("not an HTTP/1.1 status line")))
        #expect(read([String(repeating: "x", count: 20_000)]) == .failed(.malformed("head too large")))
        #expect(read([ok + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n"]) == .failed(.malformed("bad content-length")))
    }

    @Test func fetchesFromARealServerAndFailsCleanly() async throws {
        // Our own transport's /metrics, as the services serve it.
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.acceptHTTP1 = true
        config.httpHandler = MetricsEndpoint()
        config.observer = RPCServerMetrics()
        let server = RPCServer(configuration: config, services: [HealthService(services: [])])
        let port = try await server.start()
        let body = try await MetricsFetch.get(host: "127.0.0.1", port: port, timeout: .seconds(2))
        let e = PrometheusExposition(parsing: body)
        #expect(e.skippedLines == 0)
        #expect(e.value("grpc_server_connections") != nil)
        await #expect(throws: MetricsFetch.Failure.status(404)) {
            try await MetricsFetch.get(host: "127.0.0.1", port: port, path: "/nothing", timeout: .seconds(2))
        }
        await server.shutdownGracefully()

        let big = try CannedServer(answer: "HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n" + String(repeating: "x", count: 1000))
        defer { big.stop() }
        await #expect(throws: MetricsFetch.Failure.tooLarge(4 * 1024 * 1024)) {
            try await MetricsFetch.get(host: "127.0.0.1", port: big.port, timeout: .seconds(2))
        }
        let chunked = try CannedServer(answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na 1\n\r\n0\r\n\r\n", keepOpen: true)
        defer { chunked.stop() }
        #expect(try await MetricsFetch.get(host: "127.0.0.1", port: chunked.port, timeout: .seconds(2)) == Array("a 1\n".utf8))
        let closed = try CannedServer(answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        defer { closed.stop() }
        await #expect(throws: MetricsFetch.Failure.closed) {
            try await MetricsFetch.get(host: "127.0.0.1", port: closed.port, timeout: .seconds(2))
        }
        // Nobody listening.
        let gone = try CannedServer(answer: nil)
        let gonePort = gone.port
        gone.stop()
        await #expect(throws: MetricsFetch.Failure.connect("refused")) {
            try await MetricsFetch.get(host: "127.0.0.1", port: gonePort, timeout: .seconds(2))
        }
    }

    // MARK: The gateway serves it

    @Test func theGatewayServesTheStatusPage() async throws {
        let h = try await Harness { c in
            c.statusScrapeInterval = .milliseconds(100)
            c.healthInterval = .milliseconds(100)
        }
        let base = "http://127.0.0.1:\(h.port)"
        #expect(try await eventually { h.gateway.status.report().processes.allSatisfy { $0.metrics != .pending } })
        var page = try await curl([base + "/status"])
        #expect(page.status == 200)
        #expect(page.headers["content-type"] == "text/html; charset=utf-8" && page.headers["cache-control"] == "no-store")
        #expect(page.headers["content-security-policy"]?.contains("default-src 'none'") == true)
        #expect(page.body.contains("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"))
        #expect(page.body.contains("<meta http-equiv=\"refresh\" content=\"10\">"))
        for name in ["gateway", "accounts", "social"] { #expect(page.body.contains("id=\"svc-\(name)\"")) }
        // The fakes serve no /metrics: health only, and why not.
        #expect(page.body.contains("id=\"svc-accounts\" data-service=\"accounts\" data-health=\"up\" data-metrics=\"failing\""))
        #expect(!page.body.contains("127.0.0.1"), "no upstream addresses")
        let head = try await curl(["-I", base + "/status"])
        #expect(head.status == 200 && !head.body.contains("<!DOCTYPE"), "curl -I prints the head only")
        let post = try await curl(["-X", "POST", base + "/status"])
        #expect(post.status == 405 && post.headers["allow"] == "GET, HEAD")

        await h.social.stop()
        #expect(
            try await eventually {
                let r = try await curl([base + "/status.json"])
                let p = (json(r.body)["processes"] as? [[String: Any]])?.first { $0["name"] as? String == "social" }
                return p?["health"] as? String == "down"
            })
        page = try await curl([base + "/status"])
        #expect(page.body.contains("id=\"svc-social\" data-service=\"social\" data-health=\"down\""))
        #expect(page.body.contains("Down: <a href=\"#svc-social\"><strong>social</strong></a>"))
        let gateway = try #require((json(try await curl([base + "/status.json"]).body)["processes"] as? [[String: Any]])?.first)
        #expect(gateway["name"] as? String == "gateway" && gateway["metrics"] as? String == "ok")
        await h.stop()
    }
}

/// A TCP server on a thread of its own that answers every connection with fixed bytes once the
/// request's head has arrived (then closes, or keeps the connection open with `keepOpen`), or
/// never answers at all (`answer: nil`).
final class CannedServer: Sendable {
    let port: Int
    private let fd: Int32

    init(answer: String?, keepOpen: Bool = false) throws {
        let (fd, port) = try loopbackSocket(listening: 16)
        self.fd = fd
        self.port = port
        Thread {
            var held: [Int32] = []
            // Until `stop` closes the listening socket.
            while true {
                let c = accept(fd, nil, nil)
                if c < 0 { break }
                held.append(c)
                guard let answer else { continue }
                var got: [UInt8] = []
                var buf = [UInt8](repeating: 0, count: 4096)
                while !got.suffix(4).elementsEqual([13, 10, 13, 10]) {
                    let n = read(c, &buf, buf.count)
                    if n <= 0 { break }
                    got += buf[0..<n]
                }
                let bytes = Array(answer.utf8)
                _ = bytes.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if !keepOpen {
                    close(c)
                    held.removeLast()
                }
            }
            for c in held { close(c) }
        }.start()
    }

    func stop() {
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }
}
